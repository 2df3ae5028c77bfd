/* SPDX-License-Identifier: MIT */
/* worker/model: the forward pass in-process, against the reference logits of llama2.c, for
 * every kernel table, in chunks of several tokens and one token at a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "convert.h"
#include "model.h"
#include "synth.h"
#include "seg.h"
#include "testutil.h"

#define VOCAB 512

static char dir[4096];
static char *image;
static size_t image_len;
static struct shlm_model img;
static int32_t tokens[300];
static int n_rows; /* reference logits rows of prompt 1 */
static float *ref_logits;

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "model");
    char ck[4200], tok[4200], out[4200], path[4200];
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    tu_path(out, sizeof(out), "%s/f32.shlm", dir);
    struct coord_convert_opts o = {.checkpoint = ck, .tokenizer = tok, .out = out,
                                   .scheme = SHLM_SCHEME_F32, .head_bits = 8};
    struct shardlm_err e;
    if (coord_convert(&o, NULL, &e))
        return -1;
    image = tu_slurp(out, &image_len);
    struct shardlm_err err;
    if (!image || shlm_parse(&img, image, image_len, out, &err))
        return -1;
    /* prompt 1: its prompt and generated ids, and its logits */
    tu_path(path, sizeof(path), "%s/golden/stories260K/greedy.tsv", tu_data());
    char *tsv = tu_slurp(path, NULL);
    if (!tsv)
        return -1;
    char *p = strchr(tsv, '\t') + 1;
    int n = 0;
    while (*p && *p != '\n' && n < 300) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        tokens[n++] = (int32_t)v;
        p = end;
    }
    free(tsv);
    tu_path(path, sizeof(path), "%s/golden/stories260K/p1.logits.f32", tu_data());
    size_t len = 0;
    ref_logits = (float *)tu_slurp(path, &len);
    n_rows = (int)(len / (VOCAB * sizeof(float)));
    return ref_logits && n_rows <= n ? 0 : -1;
}

static int teardown(void **state)
{
    free(image);
    free(ref_logits);
    tu_rmdir(dir);
    return 0;
}

static double kld_row(const float *ref, const float *got)
{
    double mr = ref[0], mg = got[0], sr = 0, sg = 0, kl = 0;
    for (int i = 1; i < VOCAB; i++) {
        mr = fmax(mr, ref[i]);
        mg = fmax(mg, got[i]);
    }
    for (int i = 0; i < VOCAB; i++) {
        sr += exp(ref[i] - mr);
        sg += exp(got[i] - mg);
    }
    for (int i = 0; i < VOCAB; i++) {
        double lp = ref[i] - mr - log(sr), lq = got[i] - mg - log(sg);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

/* The floats of a token's row of @im's KV cache, a layer (its KV heads', or latent attention's
 * latent and RoPE key) */
static uint32_t kv_width(const struct shlm_model *im)
{
    struct seg_plan p;
    assert_int_equal(seg_plan_of(&p, im->hdr), 0);
    return (uint32_t)p.kv_dim;
}

/* whether @im's KV cache holds keys only (latent attention) */
static bool kv_keys_only(const struct shlm_model *im) { return im->hdr->cfgx.kv_lora_rank != 0; }

/* A KV cache of @ns whole contexts for model @im, its blocks interleaved between the sequences:
 * block j of sequence q is block j * ns + q (*@tables: ns tables of a context each). */
static void *kv_pool_of(const struct shlm_model *im, int ns, uint32_t **tables)
{
    const struct shlm_config *c = &im->hdr->cfg;
    uint32_t bpc = (c->seq_len + SEG_KV_BLOCK - 1) / SEG_KV_BLOCK, kvd = kv_width(im);
    void *kv = calloc(1, seg_kv_bytes(bpc * (uint32_t)ns, c->n_layers, kvd, kv_keys_only(im)));
    seg_kv_init(kv, bpc * (uint32_t)ns, c->n_layers, kvd, kv_keys_only(im));
    *tables = malloc((size_t)ns * bpc * sizeof(uint32_t));
    for (int q = 0; q < ns; q++)
        for (uint32_t j = 0; j < bpc; j++)
            (*tables)[(size_t)q * bpc + j] = j * (uint32_t)ns + (uint32_t)q;
    return kv;
}

/* kv_pool_of() the stories model */
static void *kv_pool(int ns, uint32_t **tables) { return kv_pool_of(&img, ns, tables); }

/* Sequence @q's table in kv_pool_of(@im)'s tables. */
static const uint32_t *table_in(const struct shlm_model *im, const uint32_t *tables, int q)
{
    return tables + (size_t)q * ((im->hdr->cfg.seq_len + SEG_KV_BLOCK - 1) / SEG_KV_BLOCK);
}

static const uint32_t *table_of(const uint32_t *tables, int q) { return table_in(&img, tables, q); }

/* Runs prompt 1 through a fresh KV cache in chunks of @chunk tokens (all logits), with every
 * matrix split over @pool when it is not NULL. */
static float *run_pool(const struct kn_ops *ops, int max_m, int chunk, struct wrk_pool *pool)
{
    struct wrk_model m;
    assert_int_equal(wrk_model_init(&m, &img, ops, max_m, pool, NULL), 0);
    m.par_min_work = 0;
    m.chunk_bytes = 0; /* decode's products in chunks of 16 rows, many per thread */
    uint32_t *tables;
    void *kv = kv_pool(2, &tables);
    float *out = malloc((size_t)n_rows * VOCAB * sizeof(float));
    for (int pos = 0; pos < n_rows; pos += chunk) {
        int n = n_rows - pos < chunk ? n_rows - pos : chunk;
        assert_int_equal(wrk_forward(&m, kv, table_of(tables, 1), tokens + pos, n, pos,
                                     out + (size_t)pos * VOCAB, true),
                         0);
    }
    wrk_model_free(&m);
    free(tables);
    free(kv);
    return out;
}

static float *run(const struct kn_ops *ops, int max_m, int chunk)
{
    return run_pool(ops, max_m, chunk, NULL);
}

/* Rows split over 2 and 3 threads give the same logits bit for bit, in shares (chunks) and in
 * 16-row chunks the threads take as they finish (steps of one token): each row is one dot. */
static void test_thread_pool_split(void **state)
{
    const struct kn_ops *ops = kn_ops_select(getenv("SHARDLM_ISA"), NULL, 0);
    float *one = run(ops, 16, n_rows);
    for (int t = 2; t <= 3; t++) {
        struct wrk_pool *pool;
        assert_int_equal(wrk_pool_init(&pool, t, NULL), 0);
        /* 3 threads on a 2-CPU machine oversubscribe: one chunked run only */
        for (int rep = 0; rep < (t == 2 ? 2 : 1); rep++) {
            float *many = run_pool(ops, 16, rep ? 1 : n_rows, pool);
            assert_memory_equal(one, many, (size_t)n_rows * VOCAB * sizeof(float));
            free(many);
        }
        wrk_pool_free(pool);
    }
    free(one);
}

static void test_matches_reference_every_table(void **state)
{
    const struct kn_ops *tables[4];
    int nt = kn_ops_available(tables, 4);
    for (int t = 0; t < nt; t++) {
        /* one call with internal chunks of 7 (ragged), and steps of one token (decode) */
        float *chunked = run(tables[t], 7, n_rows);
        float *stepped = run(tables[t], 1, 1);
        double worst = 0, sum = 0, diff = 0;
        for (int r = 0; r < n_rows; r++) {
            double k = kld_row(ref_logits + (size_t)r * VOCAB, chunked + (size_t)r * VOCAB);
            worst = fmax(worst, k);
            sum += k;
            for (int i = 0; i < VOCAB; i++)
                diff = fmax(diff, fabs(chunked[(size_t)r * VOCAB + i] -
                                       stepped[(size_t)r * VOCAB + i]));
        }
        fprintf(stderr, "table %-7s mean kld %.3g worst %.3g, chunked vs stepped max |d| %.3g\n",
                tables[t]->name, sum / n_rows, worst, diff);
        assert_true(sum / n_rows < 1e-6);
        assert_true(worst < 1e-5);
        assert_true(diff < 1e-3);
        free(chunked);
        free(stepped);
    }
}

/* Logits of the last token only, when all_logits is false, equal the last row of all. */
static void test_last_logits_only(void **state)
{
    const struct kn_ops *ops = kn_ops_select(getenv("SHARDLM_ISA"), NULL, 0);
    struct wrk_model m;
    assert_int_equal(wrk_model_init(&m, &img, ops, 16, NULL, NULL), 0);
    uint32_t *tables;
    void *kv = kv_pool(2, &tables);
    float *all = malloc(40 * VOCAB * sizeof(float)), last[VOCAB];
    assert_int_equal(wrk_forward(&m, kv, table_of(tables, 0), tokens, 40, 0, all, true), 0);
    /* other blocks, same sequence */
    assert_int_equal(wrk_forward(&m, kv, table_of(tables, 1), tokens, 40, 0, last, false), 0);
    assert_memory_equal(last, all + 39 * VOCAB, sizeof(last));
    free(all);
    free(tables);
    free(kv);
    wrk_model_free(&m);
}

/* A YaRN config's RoPE table in the worker against transformers' formula
 * (_compute_yarn_parameters) written out in double: frequencies extrapolated below the ramp's
 * pair floor(d(beta_fast)), interpolated (divided by factor) past ceil(d(beta_slow)), d(r) =
 * head_dim ln(orig / (2 pi r)) / (2 ln theta), a linear mix between; cos and sin times
 * 0.1 ln(factor) + 1. */
static void test_yarn_rope_table(void **state)
{
    const struct kn_ops *ops = kn_ops_select(getenv("SHARDLM_ISA"), NULL, 0);
    char *b = malloc(image_len);
    memcpy(b, image, image_len);
    struct shlm_header *h = (struct shlm_header *)b;
    h->cfg.rope_scaling = SHLM_ROPE_YARN;
    h->cfg.rope_factor = 4.0f;
    h->cfg.rope_orig_ctx = 64;
    h->cfgx.yarn_beta_fast = 32.0f;
    h->cfgx.yarn_beta_slow = 1.0f;
    shlm_seal(h, (const struct shlm_tensor *)(b + h->table_offset));
    struct shlm_model ym;
    struct shardlm_err e;
    assert_int_equal(shlm_parse(&ym, b, image_len, "yarn.shlm", &e), 0);
    struct wrk_model m;
    assert_int_equal(wrk_model_init(&m, &ym, ops, 16, NULL, NULL), 0);
    int hd = (int)h->cfg.head_dim;
    double theta = h->cfg.rope_theta, pi = 3.14159265358979323846;
    double lo = floor(hd * log(64 / (32 * 2 * pi)) / (2 * log(theta)));
    double hi = ceil(hd * log(64 / (1 * 2 * pi)) / (2 * log(theta)));
    lo = fmax(lo, 0.0);
    hi = fmin(hi, hd - 1.0);
    if (lo == hi)
        hi += 0.001;
    for (int i = 0; i < hd / 2; i++) {
        double ext = 1.0 / pow(theta, 2.0 * i / hd), inter = ext / 4.0;
        double ramp = fmin(1.0, fmax(0.0, (i - lo) / (hi - lo)));
        double want = inter * ramp + ext * (1.0 - ramp);
        assert_true(fabs(m.rope_freqs[i] - want) <= 1e-5 * want);
    }
    assert_true(fabsf(m.rope_mscale - (float)(0.1 * log(4.0) + 1.0)) < 1e-6f);
    wrk_model_free(&m);
    free(b);
}

static int prepared; /* calls of counting_prepare (atomic: pool threads call it) */
static void (*real_prepare)(struct kn_act *a, const float *x);

static void counting_prepare(struct kn_act *a, const float *x)
{
    __atomic_add_fetch(&prepared, 1, __ATOMIC_RELAXED);
    real_prepare(a, x);
}

/* The forward pass prepares every activation with its table's act_prepare, so a forced table
 * (SHARDLM_ISA=avx2) runs its own and not the fastest this CPU has: a copy of each table whose
 * entry counts its calls sees them all (per token, per layer the inputs of q/k/v, of o, of the
 * FFN and of down, then the head's), split over threads too, and the logits do not change. */
static void test_act_prepare_through_table(void **state)
{
    const struct kn_ops *all[8];
    int n = kn_ops_available(all, 8);
    int want_calls = n_rows * (4 * (int)img.hdr->cfg.n_layers + 1);
    struct wrk_pool *pool;
    assert_int_equal(wrk_pool_init(&pool, 2, NULL), 0);
    for (int i = 0; i < n; i++) {
        struct kn_ops counted = *all[i];
        counted.act_prepare = counting_prepare;
        real_prepare = all[i]->act_prepare;
        float *want = run(all[i], 16, 7);
        for (int p = 0; p < 2; p++) {
            __atomic_store_n(&prepared, 0, __ATOMIC_RELAXED);
            float *got = run_pool(&counted, 16, 7, p ? pool : NULL);
            if (prepared != want_calls)
                fail_msg("%s: %d activations prepared through the table, %d expected",
                         all[i]->name, prepared, want_calls);
            assert_memory_equal(want, got, (size_t)n_rows * VOCAB * sizeof(float));
            free(got);
        }
        free(want);
    }
    wrk_pool_free(pool);
}

/* Mean KL divergence between the rows of @a and @b (n rows). */
static double mean_kld(const float *a, const float *b, int n)
{
    double sum = 0;
    for (int r = 0; r < n; r++)
        sum += kld_row(a + (size_t)r * VOCAB, b + (size_t)r * VOCAB);
    return sum / n;
}

/* Three sequences of one step after another, as a scheduler mixes them: prefill chunks of
 * different sizes (some spanning the model's chunks of 16 rows), one-token decodes, sequences
 * joining late, logits of every row or of the last only. Each sequence's logits equal its run
 * alone (KLD below @tol; a product over many rows may sum in another order than over one). */
static void batch_vs_solo(const struct shlm_model *im, const struct kn_ops *ops,
                          struct wrk_pool *pool, double tol)
{
    enum { NS = 3 };
    const struct shlm_config *c = &im->hdr->cfg;
    const int32_t *ids[NS] = {tokens, tokens + 100, tokens + 7};
    int len[NS] = {n_rows < 120 ? n_rows : 120, 80, 33}, prompt[NS] = {20, 41, 5};
    int start[NS] = {0, 2, 3}; /* the step each sequence joins at */
    uint32_t *tables;
    void *kv = kv_pool_of(im, NS, &tables);
    size_t kvb =
        seg_kv_bytes(((struct seg_kv *)kv)->n_blocks, c->n_layers, kv_width(im), kv_keys_only(im)) -
        64;
    float *solo[NS], *got[NS];
    struct wrk_model m;
    assert_int_equal(wrk_model_init(&m, im, ops, 16, pool, NULL), 0);
    m.par_min_work = 0;
    m.chunk_bytes = 0;
    for (int q = 0; q < NS; q++) {
        solo[q] = malloc((size_t)len[q] * VOCAB * sizeof(float));
        got[q] = calloc((size_t)len[q] * VOCAB, sizeof(float));
        memset((char *)kv + 64, 0, kvb);
        assert_int_equal(
            wrk_forward(&m, kv, table_in(im, tables, 0), ids[q], len[q], 0, solo[q], true), 0);
    }
    memset((char *)kv + 64, 0, kvb);
    int pos[NS] = {0};
    for (int step = 0;; step++) {
        struct wrk_run runs[NS];
        int nr = 0;
        for (int q = 0; q < NS; q++) {
            if (step < start[q] || pos[q] == len[q])
                continue;
            /* prefill in chunks of 11 + 4q tokens, then one token a step; sequence 2 asks
             * for the last row's logits only */
            int n = pos[q] < prompt[q] ? prompt[q] - pos[q] : 1;
            n = n < 11 + 4 * q ? n : 11 + 4 * q;
            bool all = q != 2;
            float *out = got[q] + (size_t)(all ? pos[q] : pos[q] + n - 1) * VOCAB;
            runs[nr++] = (struct wrk_run){
                (uint32_t)q, ids[q] + pos[q], n, pos[q], table_in(im, tables, q), out, all};
            pos[q] += n;
        }
        if (!nr && step > start[NS - 1])
            break;
        assert_int_equal(wrk_forward_batch(&m, kv, runs, nr), 0);
    }
    for (int q = 0; q < NS; q++) {
        /* sequence 2 has the logits of its prefill's last row and of every decode */
        int from = q == 2 ? prompt[q] - 1 : 0;
        double k =
            mean_kld(solo[q] + (size_t)from * VOCAB, got[q] + (size_t)from * VOCAB, len[q] - from);
        fprintf(stderr, "%s %s%s: sequence %d in a batch against alone: mean kld %.3g\n",
                shlm_arch_of(c)->name, ops->name, pool ? " (2 threads)" : "", q, k);
        assert_true(k < tol);
        free(solo[q]);
        free(got[q]);
    }
    wrk_model_free(&m);
    free(tables);
    free(kv);
}

/* Converts as @o says and parses the file into @im: returns its bytes (the caller frees). */
static char *convert_parse(const struct coord_convert_opts *o, struct shlm_model *im)
{
    struct shardlm_err e;
    assert_int_equal(coord_convert(o, NULL, &e), 0);
    size_t len = 0;
    char *buf = tu_slurp(o->out, &len);
    assert_non_null(buf);
    assert_int_equal(shlm_parse(im, buf, len, o->out, &e), 0);
    return buf;
}

/* A step's sequences run together (worker/model.c wrk_forward_batch) give each the logits it
 * gets alone: f32, w4a8 and w4a8 with the 6-bit head, every kernel table, one thread and two. */
static void test_batch_matches_solo(void **state)
{
    char ck[4200], tok[4200], out[4200];
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    tu_path(out, sizeof(out), "%s/w4a8.shlm", dir);
    struct coord_convert_opts o = {
        .checkpoint = ck, .tokenizer = tok, .out = out, .scheme = SHLM_SCHEME_W4A8, .head_bits = 8};
    struct shlm_model w4, h6;
    char *w4_image = convert_parse(&o, &w4);
    tu_path(out, sizeof(out), "%s/w4a8-h6.shlm", dir);
    o.head_bits = 6;
    char *h6_image = convert_parse(&o, &h6);
    const struct kn_ops *tables[4];
    int nt = kn_ops_available(tables, 4);
    struct wrk_pool *pool;
    assert_int_equal(wrk_pool_init(&pool, 2, NULL), 0);
    for (int t = 0; t < nt; t++) {
        batch_vs_solo(&img, tables[t], NULL, 1e-9);
        batch_vs_solo(&w4, tables[t], NULL, 1e-6);
        batch_vs_solo(&h6, tables[t], NULL, 1e-6);
    }
    batch_vs_solo(&img, tables[nt - 1], pool, 1e-9);
    batch_vs_solo(&w4, tables[nt - 1], pool, 1e-6);
    batch_vs_solo(&h6, tables[nt - 1], pool, 1e-6);
    wrk_pool_free(pool);
    free(w4_image);
    free(h6_image);
}

/* A MoE step's tokens grouped by expert (each expert's product over the rows that chose it: 0,
 * 1 or many of them, as the routing falls) give each sequence the logits it gets alone, as
 * test_batch_matches_solo: tiny-qwen3moe, tiny-mixtral, tiny-gptoss (biases, sinks) and
 * tiny-deepseek2 (latent attention, shared experts, a dense first layer), f32 and w4a8, every
 * kernel table, one thread and two. */
static void test_moe_batch_matches_solo(void **state)
{
    static const char *const shapes[] = {"tiny-qwen3moe", "tiny-mixtral", "tiny-gptoss",
                                         "tiny-deepseek2"};
    const struct kn_ops *tables[4];
    int nt = kn_ops_available(tables, 4);
    struct wrk_pool *pool;
    assert_int_equal(wrk_pool_init(&pool, 2, NULL), 0);
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        char gguf[4200], out[4200];
        struct shardlm_err e;
        tu_path(gguf, sizeof(gguf), "%s/%s.gguf", dir, shapes[si]);
        assert_int_equal(coord_synth(shapes[si], gguf, 1, NULL, NULL, &e), 0);
        for (int w4 = 0; w4 < 2; w4++) {
            tu_path(out, sizeof(out), "%s/%s-%d.shlm", dir, shapes[si], w4);
            struct coord_convert_opts o = {.checkpoint = gguf,
                                           .out = out,
                                           .scheme = w4 ? SHLM_SCHEME_W4A8 : SHLM_SCHEME_F32,
                                           .head_bits = 8,
                                           .max_ctx = 256};
            struct shlm_model im;
            char *buf = convert_parse(&o, &im);
            assert_true(im.hdr->cfgx.n_experts > im.hdr->cfgx.n_experts_used);
            double tol = w4 ? 1e-6 : 1e-9;
            for (int t = 0; t < nt; t++)
                batch_vs_solo(&im, tables[t], NULL, tol);
            batch_vs_solo(&im, tables[nt - 1], pool, tol);
            free(buf);
        }
    }
    wrk_pool_free(pool);
}

/* Sliding-window layers over the paged cache (Gemma 2: window 32 on even layers, soft-caps;
 * Gemma 3: window 48 on five of six layers, their own RoPE base; gpt-oss: window 16 on even
 * layers, attention sinks): 200 tokens one at a time after a prompt of 10 give the logits of one
 * prefill of all 200 in chunks of 64, on every kernel table - decode reads only the window, as
 * prefill does. */
static void test_windowed_decode(void **state)
{
    static const char *const shapes[] = {"tiny-gemma2", "tiny-gemma3", "tiny-gptoss"};
    enum { N = 200, PROMPT = 10 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 37 + 11) % VOCAB);
    const struct kn_ops *tables[4];
    int nt = kn_ops_available(tables, 4);
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        char gguf[4200], out[4200];
        struct shardlm_err e;
        tu_path(gguf, sizeof(gguf), "%s/%s.gguf", dir, shapes[si]);
        tu_path(out, sizeof(out), "%s/%s.shlm", dir, shapes[si]);
        assert_int_equal(coord_synth(shapes[si], gguf, 1, NULL, NULL, &e), 0);
        struct coord_convert_opts o = {.checkpoint = gguf,
                                       .out = out,
                                       .scheme = SHLM_SCHEME_F32,
                                       .head_bits = 8,
                                       .max_ctx = 256};
        struct shlm_model im;
        char *buf = convert_parse(&o, &im);
        const struct shlm_config *c = &im.hdr->cfg;
        assert_true(im.hdr->cfgx.window > 0 && im.hdr->cfgx.window < N / 4);
        uint32_t nb = (c->seq_len + SEG_KV_BLOCK - 1) / SEG_KV_BLOCK, kvd = kv_width(&im),
                 table[64];
        assert_true(nb <= 64);
        for (uint32_t j = 0; j < nb; j++)
            table[j] = nb - 1 - j; /* blocks out of order, as a pool hands them out */
        size_t kvb = seg_kv_bytes(nb, c->n_layers, kvd, kv_keys_only(&im));
        void *kv = calloc(1, kvb);
        float *pre = malloc((size_t)N * VOCAB * sizeof(float)),
              *dec = malloc((size_t)N * VOCAB * sizeof(float));
        for (int t = 0; t < nt; t++) {
            struct wrk_model m;
            assert_int_equal(wrk_model_init(&m, &im, tables[t], 64, NULL, NULL), 0);
            seg_kv_init(kv, nb, c->n_layers, kvd, kv_keys_only(&im));
            assert_int_equal(wrk_forward(&m, kv, table, ids, N, 0, pre, true), 0);
            memset(kv, 0, kvb);
            seg_kv_init(kv, nb, c->n_layers, kvd, kv_keys_only(&im));
            assert_int_equal(wrk_forward(&m, kv, table, ids, PROMPT, 0, dec, true), 0);
            for (int p = PROMPT; p < N; p++)
                assert_int_equal(
                    wrk_forward(&m, kv, table, ids + p, 1, p, dec + (size_t)p * VOCAB, false), 0);
            double k = mean_kld(pre, dec, N);
            fprintf(stderr, "%s %s: decode against prefill, %d tokens: mean kld %.3g\n", shapes[si],
                    tables[t]->name, N, k);
            assert_true(k < 1e-9);
            wrk_model_free(&m);
        }
        free(pre);
        free(dec);
        free(kv);
        free(buf);
    }
}

/* the logit whose sigmoid is @p */
static float logit_of(double p) { return (float)log(p / (1.0 - p)); }

/* The routing rules on hand-made scores (worker/model.c wrk_route): 16 experts in 4 groups of
 * 4, 4 used. Sigmoid scores 0.9 (expert 0), 0.8 and 0.8 (4, 5), 0.7 and 0.75 (8, 9), the rest 0.1
 * or 0.2 (group 3): the best single expert is 0, the best groups by their two best's sum are 1
 * (1.6) and 2 (1.45), not 0 (1.0). */
static void test_route_rules(void **state)
{
    (void)state;
    float lg[16];
    for (int e = 0; e < 16; e++)
        lg[e] = logit_of(e >= 12 ? 0.2 : 0.1);
    lg[0] = logit_of(0.9);
    lg[4] = lg[5] = logit_of(0.8);
    lg[8] = logit_of(0.7);
    lg[9] = logit_of(0.75);
    int ch[4];
    float w[4];
    struct shlm_config_ext x = {.n_experts = 16,
                                .n_experts_used = 4,
                                .expert_ffn = 8,
                                .moe_route = SHLM_ROUTE_SIGMOID_NORM};
    /* one group: the four best, the tie (4, 5) to the higher index, renormalised */
    wrk_route(&x, lg, NULL, ch, w);
    int want0[4] = {0, 5, 4, 9};
    for (int j = 0; j < 4; j++)
        assert_int_equal(ch[j], want0[j]);
    assert_float_equal(w[0], 0.9 / 3.25, 1e-6);
    assert_float_equal(w[3], 0.75 / 3.25, 1e-6);
    /* DeepSeek-V3's groups (2 of 4, by the two best's sum): group 0's expert is out; times the
     * route scale */
    x.n_groups = 4;
    x.topk_groups = 2;
    x.route_scale = 2.5f;
    wrk_route(&x, lg, NULL, ch, w);
    int want1[4] = {5, 4, 9, 8};
    for (int j = 0; j < 4; j++)
        assert_int_equal(ch[j], want1[j]);
    assert_float_equal(w[0], 2.5 * 0.8 / 3.05, 1e-6);
    assert_float_equal(w[3], 2.5 * 0.7 / 3.05, 1e-6);
    /* the selection bias chooses (expert 14 of group 3 lifted past all: group 3 then sums
     * 1.4 + 0.2, above group 2) but does not weigh: 14 weighs its own score 0.2 */
    float sel[16] = {0};
    sel[14] = 1.2f;
    wrk_route(&x, lg, sel, ch, w);
    int want2[4] = {14, 5, 4, 15};
    for (int j = 0; j < 4; j++)
        assert_int_equal(ch[j], want2[j]);
    assert_float_equal(w[0], 2.5 * 0.2 / 2.0, 1e-6);
    /* not renormalised: each weight its score times the scale */
    x.moe_route = SHLM_ROUTE_SIGMOID;
    wrk_route(&x, lg, NULL, ch, w);
    assert_float_equal(w[0], 2.5 * 0.8, 1e-6);
    /* softmax routing's groups (DeepSeek-V2's group_limited_greedy) go by their best expert:
     * one group of 4 is group 0 (holding the best, 0), though group 1 sums more */
    x.moe_route = SHLM_ROUTE_SOFTMAX;
    x.topk_groups = 1;
    x.route_scale = 0.0f;
    wrk_route(&x, lg, NULL, ch, w);
    assert_int_equal(ch[0], 0);
    for (int j = 1; j < 4; j++)
        assert_true(ch[j] >= 1 && ch[j] <= 3);
    double sum = 0.0;
    for (int e = 0; e < 16; e++)
        sum += exp((double)lg[e]);
    assert_float_equal(w[0], exp((double)lg[0]) / sum, 1e-6);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference_every_table),
        cmocka_unit_test(test_last_logits_only),
        cmocka_unit_test(test_thread_pool_split),
        cmocka_unit_test(test_act_prepare_through_table),
        cmocka_unit_test(test_batch_matches_solo),
        cmocka_unit_test(test_moe_batch_matches_solo),
        cmocka_unit_test(test_yarn_rope_table),
        cmocka_unit_test(test_windowed_decode),
        cmocka_unit_test(test_route_rules),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
