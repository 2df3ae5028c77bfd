/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth{,_hf}.c: every architecture shape written twice is the same file; its
 * GGUF (F32 and F16) and its Hugging Face folder parse with our readers and hold the same model
 * (tensor by tensor: HF's q/k rows against the GGUF's interleaved ones, Gemma's w against 1 + w,
 * the same tokenizer); `shardlm synth --help` lists the shapes; the references under
 * tests/data/golden/<shape> (tools/ik_ref/make_refs.sh) have a logits row per id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "gguf.h"
#include "safetensors.h"
#include "synth.h"
#include "testutil.h"
#include "tokenizer.h"

static char dir[4096];

static int setup(void **state)
{
    (void)state;
    tu_mkdtemp(dir, sizeof(dir), "synth");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmdir(dir);
    return 0;
}

/* The architecture shapes: those with a Hugging Face form and "tiny-" names. */
static bool tiny_arch(const struct coord_synth_shape *s)
{
    return s->hf_type && strncmp(s->name, "tiny-", 5) == 0;
}

static void synth(const char *shape, const char *out, bool hf, bool f32)
{
    struct shardlm_err e;
    struct coord_synth_opts o = {.shape = shape, .out = out, .hf = hf, .f32 = f32, .seed = 1};
    int rc = coord_synth_write(&o, &e);
    if (rc)
        fail_msg("synth %s: %s", shape, e.msg);
}

static bool same_file(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *x = tu_slurp(a, &la), *y = tu_slurp(b, &lb);
    bool same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

/* Writing a shape twice (and its HF folder twice) gives the same bytes. */
static void test_deterministic(void **state)
{
    (void)state;
    size_t n;
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tiny_arch(&shapes[i]))
            continue;
        char a[4300], b[4300];
        tu_path(a, sizeof(a), "%s/a.gguf", dir);
        tu_path(b, sizeof(b), "%s/b.gguf", dir);
        synth(shapes[i].name, a, false, false);
        synth(shapes[i].name, b, false, false);
        assert_true(same_file(a, b));
        tu_path(a, sizeof(a), "%s/ha", dir);
        tu_path(b, sizeof(b), "%s/hb", dir);
        synth(shapes[i].name, a, true, true);
        synth(shapes[i].name, b, true, true);
        static const char *files[] = {"config.json", "model.safetensors", "tokenizer.json",
                                      "tokenizer_config.json"};
        for (int f = 0; f < 4; f++) {
            char fa[4400], fb[4400];
            tu_path(fa, sizeof(fa), "%s/%s", a, files[f]);
            tu_path(fb, sizeof(fb), "%s/%s", b, files[f]);
            assert_true(same_file(fa, fb));
        }
        seen++;
    }
    assert_int_equal(seen, 13);
}

/* The HF name of GGUF tensor @g of shape @s (of its expert @x where it holds a layer's experts:
 * the writer's table, restated). */
static bool hf_name(const struct coord_synth_shape *s, const char *g, int x, char *out, size_t len)
{
    static const struct {
        const char *gguf, *qwen, *mixtral; /* "%d" the expert */
    } moe[] = {
        {"ffn_gate_inp", "mlp.gate", "block_sparse_moe.gate"},
        {"ffn_gate_exps", "mlp.experts.%d.gate_proj", "block_sparse_moe.experts.%d.w1"},
        {"ffn_up_exps", "mlp.experts.%d.up_proj", "block_sparse_moe.experts.%d.w3"},
        {"ffn_down_exps", "mlp.experts.%d.down_proj", "block_sparse_moe.experts.%d.w2"},
    };
    static const struct {
        const char *gguf, *hf, *gemma_hf;
    } names[] = {
        {"attn_norm", "input_layernorm", NULL},
        {"attn_q", "self_attn.q_proj", NULL},
        {"attn_k", "self_attn.k_proj", NULL},
        {"attn_v", "self_attn.v_proj", NULL},
        {"attn_qkv", "self_attn.qkv_proj", NULL},
        {"attn_q_norm", "self_attn.q_norm", NULL},
        {"attn_k_norm", "self_attn.k_norm", NULL},
        {"attn_output", "self_attn.o_proj", NULL},
        {"post_attention_norm", "post_attention_layernorm", NULL},
        {"ffn_norm", "post_attention_layernorm", "pre_feedforward_layernorm"},
        {"ffn_gate", "mlp.gate_proj", NULL},
        {"ffn_up", "mlp.up_proj", NULL},
        {"ffn_down", "mlp.down_proj", NULL},
        {"post_ffw_norm", "post_feedforward_layernorm", NULL},
        /* DeepSeek's */
        {"attn_q_a", "self_attn.q_a_proj", NULL},
        {"attn_q_a_norm", "self_attn.q_a_layernorm", NULL},
        {"attn_q_b", "self_attn.q_b_proj", NULL},
        {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa", NULL},
        {"attn_kv_a_norm", "self_attn.kv_a_layernorm", NULL},
        {"attn_kv_b", "self_attn.kv_b_proj", NULL},
        {"ffn_gate_shexp", "mlp.shared_experts.gate_proj", NULL},
        {"ffn_up_shexp", "mlp.shared_experts.up_proj", NULL},
        {"ffn_down_shexp", "mlp.shared_experts.down_proj", NULL},
    };
    if (!strcmp(g, "token_embd.weight"))
        return snprintf(out, len, "model.embed_tokens.weight") > 0;
    if (!strcmp(g, "output_norm.weight"))
        return snprintf(out, len, "model.norm.weight") > 0;
    if (!strcmp(g, "output.weight"))
        return snprintf(out, len, "lm_head.weight") > 0;
    int l;
    char role[64];
    if (strstr(g, ".exp_probs_b.bias") && sscanf(g, "blk.%d.", &l) == 1)
        return snprintf(out, len, "model.layers.%d.mlp.gate.e_score_correction_bias", l) > 0;
    if (sscanf(g, "blk.%d.%63[a-z_].weight", &l, role) != 2)
        return false; /* rope_freqs, rope_factors_*: config.json's rope_scaling */
    for (size_t i = 0; i < sizeof(moe) / sizeof(moe[0]); i++)
        if (!strcmp(role, moe[i].gguf)) {
            char part[80];
            snprintf(part, sizeof(part),
                     strcmp(s->hf_type, "mixtral") ? moe[i].qwen : moe[i].mixtral, x);
            snprintf(out, len, "model.layers.%d.%s.weight", l, part);
            return true;
        }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(role, names[i].gguf)) {
            const char *h = s->gemma && names[i].gemma_hf ? names[i].gemma_hf : names[i].hf;
            if (s->fused && !strcmp(role, "ffn_up"))
                h = "mlp.gate_up_proj";
            snprintf(out, len, "model.layers.%d.%s.weight", l, h);
            return true;
        }
    fail_msg("%s: a GGUF tensor without an HF name", g);
    return false;
}

/* The span of vectors of length @dim added one by one: an orthonormal basis of what was added. */
struct span {
    uint32_t dim, n;
    double b[64][64];
};

/* Adds @v (every @stride-th of @dim floats) to @sp: its part outside the span, if more than 1e-4
 * of its norm (float rounding of sums of a few products stays far below), joins the basis. */
static void span_add(struct span *sp, const float *v, uint64_t stride)
{
    double r[64], n0 = 0, n1 = 0;
    for (uint32_t j = 0; j < sp->dim; j++) {
        r[j] = v[j * stride];
        n0 += r[j] * r[j];
    }
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < sp->n; i++) {
            double d = 0;
            for (uint32_t j = 0; j < sp->dim; j++)
                d += r[j] * sp->b[i][j];
            for (uint32_t j = 0; j < sp->dim; j++)
                r[j] -= d * sp->b[i][j];
        }
    for (uint32_t j = 0; j < sp->dim; j++)
        n1 += r[j] * r[j];
    if (n1 <= 1e-8 * n0 || sp->n == 64)
        return;
    for (uint32_t j = 0; j < sp->dim; j++)
        sp->b[sp->n][j] = r[j] / sqrt(n1);
    sp->n++;
}

/* The F32 GGUF and the F32 HF folder of every tiny architecture shape: GGUF keys ik reads, every
 * tensor of the one in the other with the same values (q/k rows permuted for interleaved RoPE,
 * Gemma norms 1 + w), config.json's fields, the same tokenizer; the rows of every matrix that
 * reads the residual stream (embeddings, head, q/k/v, gate/up) and the columns of every one that
 * writes it (attention output, FFN down) span one subspace of the shape's rank. */
static void test_gguf_and_hf_agree(void **state)
{
    (void)state;
    size_t n;
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n);
    for (size_t i = 0; i < n; i++) {
        const struct coord_synth_shape *s = &shapes[i];
        /* gpt-oss's folder holds its experts fused, as MXFP4 blocks: test_archs converts both
         * files and compares each with ik_llama.cpp's logits (KLD 1.7496e-6 from either) */
        if (!tiny_arch(s) || s->mxfp4)
            continue;
        char gpath[4300], hdir[4300], stp[4400], cfgp[4400], tokp[4400];
        tu_path(gpath, sizeof(gpath), "%s/%s.gguf", dir, s->name);
        tu_path(hdir, sizeof(hdir), "%s/%s", dir, s->name);
        synth(s->name, gpath, false, true);
        synth(s->name, hdir, true, true);
        struct shardlm_err e;
        struct gguf_file g;
        struct st_file st;
        if (gguf_open(&g, gpath, &e))
            fail_msg("%s", e.msg);
        tu_path(stp, sizeof(stp), "%s/model.safetensors", hdir);
        if (st_open(&st, stp, &e))
            fail_msg("%s", e.msg);

        struct gguf_str arch;
        assert_int_equal(gguf_get_str(&g, "general.architecture", &arch), 0);
        assert_true(gguf_str_eq(arch, s->arch));
        char key[96];
        uint32_t u;
        snprintf(key, sizeof(key), "%s.block_count", s->arch);
        assert_int_equal(gguf_get_u32(&g, key, &u), 0);
        assert_int_equal(u, s->layers);
        snprintf(key, sizeof(key), "%s.attention.sliding_window", s->arch);
        assert_int_equal(gguf_get_u32(&g, key, &u), s->window ? 0 : -ENOENT);

        /* tensor by tensor */
        size_t n_hf = 0;
        static struct span sp;
        sp.dim = s->dim;
        sp.n = 0;
        for (uint64_t t = 0; t < g.n_tensors; t++) {
            const struct gguf_tensor *gt = &g.tensors[t];
            char gname[96], hname[128];
            snprintf(gname, sizeof(gname), "%.*s", (int)gt->name.len, gt->name.p);
            assert_int_equal(gt->type, GGML_F32);
            /* a layer's experts: [experts][rows][cols], expert x the HF tensor of its own */
            uint64_t mats = gt->n_dims == 3 ? gt->dims[2] : 1;
            for (uint64_t x = 0; x < mats; x++) {
                if (!hf_name(s, gname, (int)x, hname, sizeof(hname)))
                    break;
                const struct st_tensor *ht = st_find(&st, hname);
                if (!ht)
                    fail_msg("%s: %s (GGUF %s) missing", s->name, hname, gname);
                n_hf++;
                uint64_t rows = gguf_tensor_rows(gt) / mats, cols = gt->dims[0];
                assert_int_equal(st_tensor_rows(ht), rows);
                assert_int_equal(ht->shape[ht->n_dims - 1], cols);
                float *a = malloc(rows * cols * sizeof(float)),
                      *b = malloc(rows * cols * sizeof(float));
                assert_non_null(a);
                assert_non_null(b);
                assert_int_equal(gguf_read_rows(&g, gt, x * rows, (x + 1) * rows, a, &e), 0);
                assert_int_equal(st_read_rows(&st, ht, 0, rows, b, "hf", &e), 0);
                bool q = strstr(gname, "attn_q.") != NULL, k = strstr(gname, "attn_k.") != NULL;
                bool norm = strstr(gname, "norm") != NULL;
                uint64_t hd = s->head_dim;
                for (uint64_t r = 0; r < rows; r++) {
                    uint64_t gr = r; /* the GGUF row of HF row r */
                    if (s->llama_rope && (q || k)) {
                        uint64_t h = r / hd, j = r % hd;
                        gr = h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
                    }
                    for (uint64_t c = 0; c < cols; c++) {
                        float want = b[r * cols + c] + (s->gemma && norm ? 1.0f : 0.0f);
                        if (a[gr * cols + c] != want)
                            fail_msg("%s %s row %lu col %lu: GGUF %g, HF %g", s->name, gname,
                                     (unsigned long)r, (unsigned long)c, a[gr * cols + c],
                                     b[r * cols + c]);
                    }
                }
                /* norms random around 1, not all 1.0 (Qwen3's q/k norms: "non-trivial"); Gemma's
                 * post-norms around 1 / sqrt(layers) */
                float mean = strstr(gname, "post_") ? 1.0f / sqrtf((float)s->layers) : 1.0f;
                if (norm && rows == 1 && strcmp(gname, "output_norm.weight"))
                    assert_true(a[0] != a[1] && fabsf(a[0] - mean) < 0.6f * mean);
                bool writes = strstr(gname, "attn_output.") || strstr(gname, "ffn_down.") ||
                              strstr(gname, "ffn_down_exps.") || strstr(gname, "ffn_down_shexp.");
                /* latent attention's inner products (q's expansion, kv_b) touch no stream */
                bool inner = strstr(gname, "attn_q_b.") || strstr(gname, "attn_kv_b.");
                if (!norm && rows > 1 && writes) {
                    assert_int_equal(rows, s->dim);
                    for (uint64_t c = 0; c < cols; c++)
                        span_add(&sp, a + c, cols);
                } else if (!norm && rows > 1 && !inner) {
                    assert_int_equal(cols, s->dim);
                    for (uint64_t r = 0; r < rows; r++)
                        span_add(&sp, a + r * cols, 1);
                }
                free(a);
                free(b);
            }
        }
        assert_int_equal(n_hf, st.n_tensors);
        if (sp.n != s->rank)
            fail_msg("%s: the weights span %u dimensions of the stream, not %u", s->name, sp.n,
                     s->rank);

        /* config.json */
        tu_path(cfgp, sizeof(cfgp), "%s/config.json", hdir);
        json_error_t je;
        json_t *c = json_load_file(cfgp, 0, &je);
        assert_non_null(c);
        assert_string_equal(json_string_value(json_object_get(c, "model_type")), s->hf_type);
        assert_string_equal(
            json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), s->hf_class);
        assert_int_equal(json_integer_value(json_object_get(c, "num_hidden_layers")), s->layers);
        assert_int_equal(json_integer_value(json_object_get(c, "num_key_value_heads")),
                         s->kv_heads);
        assert_true(json_is_true(json_object_get(c, "tie_word_embeddings")) == !s->untied);
        if (s->window)
            assert_int_equal(json_integer_value(json_object_get(c, "sliding_window")), s->window);
        if (s->logit_scale)
            assert_true(json_real_value(json_object_get(c, "logits_scaling")) == s->logit_scale);
        if (s->no_rope_every) {
            json_t *nr = json_object_get(c, "no_rope_layers");
            assert_int_equal(json_array_size(nr), s->layers);
            assert_int_equal(json_integer_value(json_array_get(nr, 3)), 0);
            assert_int_equal(json_integer_value(json_array_get(nr, 0)), 1);
        }
        if (s->rope != COORD_SYNTH_ROPE_PLAIN) {
            json_t *rs = json_object_get(c, "rope_scaling");
            assert_true(json_is_object(rs));
            if (s->rope == COORD_SYNTH_ROPE_LONGROPE) { /* the GGUF's factor tables */
                const struct gguf_tensor *lt = gguf_tensor(&g, "rope_factors_long.weight");
                float f[128];
                assert_non_null(lt);
                assert_int_equal(gguf_read_rows(&g, lt, 0, 1, f, &e), 0);
                json_t *lf = json_object_get(rs, "long_factor");
                assert_int_equal(json_array_size(lf), s->head_dim / 2);
                for (uint32_t j = 0; j < s->head_dim / 2; j++)
                    assert_true((float)json_number_value(json_array_get(lf, j)) == f[j]);
            }
        }
        json_decref(c);

        /* the tokenizers: the GGUF's and tokenizer.json give the same ids */
        struct coord_tok tg, th;
        size_t tl = 0;
        tu_path(tokp, sizeof(tokp), "%s/tokenizer.json", hdir);
        char *tj = tu_slurp(tokp, &tl);
        assert_non_null(tj);
        if (coord_tok_from_gguf(&tg, &g, "gguf", &e))
            fail_msg("%s", e.msg);
        if (coord_tok_from_hf_json(&th, (const uint8_t *)tj, tl, "tokenizer.json", &e))
            fail_msg("%s", e.msg);
        int32_t ia[64], ib[64];
        const char *text = "Hello, world! It's 2024: naive caf\xc3\xa9.";
        int na = coord_tok_encode(&tg, text, true, false, ia, 64);
        int nb = coord_tok_encode(&th, text, true, false, ib, 64);
        assert_true(na > 2);
        assert_int_equal(na, nb);
        assert_memory_equal(ia, ib, (size_t)na * sizeof(int32_t));
        assert_int_equal(ia[0], (int32_t)s->vocab - 2); /* BOS */
        coord_tok_free(&tg);
        coord_tok_free(&th);
        free(tj);
        st_close(&st);
        gguf_close(&g);
    }
}

/* --help lists every shape; --hf of a shape without an HF form and -o with --hf are refused. */
static void test_cli(void **state)
{
    (void)state;
    static struct tu_run run;
    struct tu_run *r = &run;
    char *help[] = {(char *)tu_bin(), "synth", "--help", NULL};
    tu_run_cmd(r, help, NULL, 60, NULL, NULL);
    assert_int_equal(r->status, 0);
    size_t n;
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n);
    for (size_t i = 0; i < n; i++) {
        char line[64];
        snprintf(line, sizeof(line), "\n  %s ", shapes[i].name);
        if (!strstr(r->out, line))
            fail_msg("synth --help lacks %s", shapes[i].name);
    }
    assert_non_null(strstr(r->out, "--hf DIR"));
    char out[4300];
    tu_path(out, sizeof(out), "%s/x", dir);
    char *bad[] = {(char *)tu_bin(), "synth", "--shape", "tiny", "--hf", out, NULL};
    tu_run_cmd(r, bad, NULL, 60, NULL, NULL);
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "shape 'tiny' has no Hugging Face form (--hf)"));
    char *type[] = {(char *)tu_bin(), "synth", "--shape", "tiny", "--type", "q4", "-o", out, NULL};
    tu_run_cmd(r, type, NULL, 60, NULL, NULL);
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "--type 'q4': expected f16 or f32"));
}

/* Each tiny shape's references: greedy.tsv lines of ids within the vocabulary, each with its
 * logits file of one row (float16 or float32 by its name) per id fed, 300 ids, finite. */
static void test_references(void **state)
{
    (void)state;
    size_t n;
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        const struct coord_synth_shape *s = &shapes[i];
        if (!tiny_arch(s))
            continue;
        char tsv[4300];
        tu_path(tsv, sizeof(tsv), "%s/golden/%s/greedy.tsv", tu_data(), s->name);
        size_t len;
        char *text = tu_slurp(tsv, &len);
        if (!text)
            fail_msg("%s: missing", tsv);
        int lines = 0;
        for (char *save, *line = strtok_r(text, "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
            char *f[5], *p = line;
            for (int k = 0; k < 5; k++) {
                f[k] = p;
                p = strchr(p, '\t');
                if (k < 4) {
                    assert_non_null(p);
                    *p++ = 0;
                }
            }
            int ids = 0;
            for (int k = 1; k <= 2; k++)
                for (char *q = f[k], *end;; q = end) {
                    long v = strtol(q, &end, 10);
                    if (end == q)
                        break;
                    assert_true(v >= 0 && v < (long)s->vocab);
                    ids++;
                }
            assert_int_equal(ids, 300);
            char lp[4400];
            tu_path(lp, sizeof(lp), "%s/golden/%s/%s", tu_data(), s->name, f[4]);
            size_t ll;
            unsigned char *lg = (unsigned char *)tu_slurp(lp, &ll);
            assert_non_null(lg);
            bool f16 = strlen(f[4]) > 4 && !strcmp(f[4] + strlen(f[4]) - 4, ".f16");
            assert_int_equal(ll, (size_t)ids * s->vocab * (f16 ? 2 : 4));
            for (size_t j = 0; f16 && j < ll / 2; j++) /* no inf/NaN: exponent not all ones */
                assert_true((lg[2 * j + 1] & 0x7c) != 0x7c);
            free(lg);
            lines++;
        }
        assert_true(lines >= 2);
        free(text);
        seen++;
    }
    assert_int_equal(seen, 13);
}

/* tiny-gptoss as gpt-oss's GGUFs hold it: experts MXFP4 (3-D [cols, rows, experts]), their
 * biases 2-D [n, experts] F32, the rest F16; with --type f32 every tensor F32 and the experts'
 * values the same, bit for bit (drawn on MXFP4's grid); a dense or non-gpt-oss shape has no
 * MXFP4 tensor. */
static void test_gptoss_mxfp4(void **state)
{
    (void)state;
    char a[4300], b[4300];
    tu_path(a, sizeof(a), "%s/gptoss.gguf", dir);
    tu_path(b, sizeof(b), "%s/gptoss-f32.gguf", dir);
    synth("tiny-gptoss", a, false, false);
    synth("tiny-gptoss", b, false, true);
    const struct coord_synth_shape *s = coord_synth_shape("tiny-gptoss");
    struct shardlm_err e;
    struct gguf_file ga, gb;
    if (gguf_open(&ga, a, &e) || gguf_open(&gb, b, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(ga.n_tensors, gb.n_tensors);
    int mx = 0, biases = 0;
    for (uint64_t t = 0; t < ga.n_tensors; t++) {
        const struct gguf_tensor *ta = &ga.tensors[t];
        char name[96];
        snprintf(name, sizeof(name), "%.*s", (int)ta->name.len, ta->name.p);
        const struct gguf_tensor *tb = gguf_tensor(&gb, name);
        assert_non_null(tb);
        assert_int_equal(tb->type, GGML_F32);
        bool exps = strstr(name, "_exps.") != NULL, bias = strstr(name, ".bias") != NULL;
        if (exps && !bias) {
            assert_int_equal(ta->type, GGML_MXFP4);
            assert_int_equal(ta->n_dims, 3);
            assert_int_equal(ta->dims[2], s->experts);
            uint64_t n = gguf_tensor_rows(ta) * ta->dims[0];
            float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
            assert_non_null(x);
            assert_non_null(y);
            assert_int_equal(gguf_read_rows(&ga, ta, 0, gguf_tensor_rows(ta), x, &e), 0);
            assert_int_equal(gguf_read_rows(&gb, tb, 0, gguf_tensor_rows(tb), y, &e), 0);
            assert_memory_equal(x, y, n * sizeof(float));
            free(x);
            free(y);
            mx++;
        } else if (exps) {
            assert_int_equal(ta->type, GGML_F32);
            assert_int_equal(ta->n_dims, 2);
            assert_int_equal(ta->dims[1], s->experts);
            biases++;
        } else {
            assert_true(ta->type == GGML_F16 || ta->type == GGML_F32);
        }
    }
    assert_int_equal(mx, 3 * (int)s->layers);
    assert_int_equal(biases, 3 * (int)s->layers);
    gguf_close(&ga);
    gguf_close(&gb);
    synth("tiny-qwen3moe", a, false, false);
    if (gguf_open(&ga, a, &e))
        fail_msg("%s", e.msg);
    for (uint64_t t = 0; t < ga.n_tensors; t++)
        assert_int_not_equal(ga.tensors[t].type, GGML_MXFP4);
    gguf_close(&ga);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gptoss_mxfp4),      cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_gguf_and_hf_agree), cmocka_unit_test(test_cli),
        cmocka_unit_test(test_references),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
