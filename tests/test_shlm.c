/* SPDX-License-Identifier: MIT */
/* shm/shlm + coordinator/convert + coordinator/llama2c: the .shlm format written by convert and
 * read back; every corruption is refused with a message naming the field; untied classifiers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "convert.h"
#include "llama2c.h"
#include "plan.h"
#include "shlm.h"
#include "tensors.h"
#include "testutil.h"

static char dir[4096];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "shlm");
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

static void convert_to(const char *ck, const char *out, enum shlm_scheme s, int group, int head)
{
    char tok[4200];
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    struct coord_convert_opts o = {.checkpoint = ck, .tokenizer = tok, .out = out, .scheme = s,
                                   .group = group, .head_bits = head};
    struct shardlm_err e;
    int rc = coord_convert(&o, NULL, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
}

static const char *stories(void)
{
    static char p[4200];
    tu_path(p, sizeof(p), "%s/models/stories260K/stories260K.bin", tu_src());
    return p;
}

static void test_roundtrip_every_scheme(void **state)
{
    static const struct { enum shlm_scheme s; int group, head; enum kn_dtype mat, emb; } cases[] = {
        {SHLM_SCHEME_F32, 0, 8, KN_DT_F32, KN_DT_F32},
        {SHLM_SCHEME_BF16, 0, 8, KN_DT_BF16, KN_DT_BF16},
        {SHLM_SCHEME_W4A16, 64, 8, KN_DT_W4A16, KN_DT_Q8},
        {SHLM_SCHEME_W4A16, 128, 4, KN_DT_W4A16, KN_DT_W4A16},
        {SHLM_SCHEME_W4A8, 128, 8, KN_DT_W4A8, KN_DT_Q8},
        {SHLM_SCHEME_W4A8, 64, 4, KN_DT_W4A8, KN_DT_W4A8},
    };
    struct coord_llama2c ck;
    struct shardlm_err e;
    assert_int_equal(coord_llama2c_open(&ck, stories(), &e), 0);
    assert_int_equal(ck.cfg.dim, 64);
    assert_int_equal(ck.cfg.hidden_dim, 172);
    assert_int_equal(ck.cfg.n_kv_heads, 4);
    assert_true(ck.cfg.tied_embd);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[4300];
        tu_path(out, sizeof(out), "%s/m%zu.shlm", dir, i);
        convert_to(stories(), out, cases[i].s, cases[i].group, cases[i].head);
        size_t len = 0;
        char *buf = tu_slurp(out, &len);
        struct shlm_model m;
        struct shardlm_err err;
        assert_int_equal(shlm_parse(&m, buf, len, out, &err), 0);
        assert_int_equal(shlm_verify_data(&m, out, &err), 0);
        assert_int_equal(len % SHLM_ALIGN, 0);
        for (uint32_t t = 0; t < m.hdr->n_tensors; t++)
            assert_int_equal(m.tensors[t].offset % SHLM_ALIGN, 0);
        const struct shlm_tensor *up = shlm_find(&m, "blk.2.ffn_up");
        const struct shlm_tensor *emb = shlm_find(&m, "tok_embd");
        assert_non_null(up);
        assert_non_null(emb);
        assert_null(shlm_find(&m, "output")); /* tied */
        assert_int_equal(up->dtype, cases[i].mat);
        assert_int_equal(emb->dtype, cases[i].emb);
        /* dequantized rows stay close to the source: ragged groups (cols 172) included */
        struct kn_mat v;
        shlm_view(&m, up, &v);
        const float *src = coord_llama2c_tensor(&ck, SHLM_KIND_FFN_UP, 2);
        float row[64], err2 = 0, ref2 = 0;
        for (int r = 0; r < v.rows; r++) {
            kn_mat_row(&v, r, row);
            for (int c = 0; c < v.cols; c++) {
                float d = row[c] - src[r * v.cols + c];
                err2 += d * d;
                ref2 += src[r * v.cols + c] * src[r * v.cols + c];
            }
        }
        float rel = sqrtf(err2 / ref2);
        /* int4: ~10% relative RMS error; bf16 ~0.3%; f32 exact */
        float bound = cases[i].s == SHLM_SCHEME_F32 ? 0.0f : cases[i].s == SHLM_SCHEME_BF16 ? 0.005f : 0.15f;
        assert_true(rel <= bound);
        free(buf);
    }
    coord_llama2c_close(&ck);
}

/* Writes @buf with one change and expects shlm_parse to refuse it, naming @needle. */
static void expect_refused(const char *buf, size_t len, const char *needle)
{
    struct shlm_model m;
    struct shardlm_err err = {{0}};
    int rc = shlm_parse(&m, buf, len, "x.shlm", &err);
    if (rc == 0 || !strstr(err.msg, needle))
        fprintf(stderr, "rc %d err '%s', wanted '%s'\n", rc, err.msg, needle);
    assert_true(rc < 0);
    assert_non_null(strstr(err.msg, needle));
    assert_non_null(strstr(err.msg, "x.shlm"));
}

/* Recomputes the header checksum after an edit, so the deeper checks are reached. */
static void reseal(char *buf)
{
    struct shlm_header *h = (struct shlm_header *)buf;
    h->checksum = 0;
    h->checksum = shlm_hash(h, sizeof(*h)) ^
                  shlm_hash(buf + h->table_offset, h->n_tensors * sizeof(struct shlm_tensor));
}

static void test_corruptions(void **state)
{
    char out[4300];
    tu_path(out, sizeof(out), "%s/c.shlm", dir);
    convert_to(stories(), out, SHLM_SCHEME_W4A8, 128, 8);
    size_t len = 0;
    char *good = tu_slurp(out, &len), *b = malloc(len);
    struct shlm_header *h = (struct shlm_header *)b;
    struct shlm_tensor *t;

    expect_refused(good, 100, "shorter than the");
    memcpy(b, good, len);
    b[0] = 'X';
    expect_refused(b, len, "not a .shlm file");
    expect_refused(good, len - 4096, "truncated");
    memcpy(b, good, len);
    h->version = 99;
    expect_refused(b, len, "version");
    memcpy(b, good, len);
    h->cfg.dim = 65;
    expect_refused(b, len, "checksum");
    reseal(b);
    expect_refused(b, len, "tensor tok_embd: dtype/shape");
    memcpy(b, good, len);
    h->n_tensors = 0x7fffffff;
    expect_refused(b, len, "n_tensors");
    memcpy(b, good, len);
    h->table_offset = len - 8; /* checked before the checksum, which would read past the end */
    expect_refused(b, len, "table_offset");
    memcpy(b, good, len);
    h->cfg.n_kv_heads = 3;
    reseal(b);
    expect_refused(b, len, "n_kv_heads");
    memcpy(b, good, len);
    h->scheme = 9;
    reseal(b);
    expect_refused(b, len, "scheme");
    /* what the newer architectures add: unimplemented flags and fields refused by name; q/k norms
     * are implemented, so their tensors are then missing */
#define EDIT(stmt, needle)                                                                         \
    do {                                                                                           \
        memcpy(b, good, len);                                                                      \
        stmt;                                                                                      \
        reseal(b);                                                                                 \
        expect_refused(b, len, needle);                                                            \
    } while (0)
    EDIT(h->cfg.flags = 1u << 6, "config field flags");
    EDIT(h->cfg.flags = SHLM_CF_QK_NORM, "the config needs");
    EDIT(h->cfg.flags = SHLM_CF_POST_NORMS, "the config needs");
    EDIT(h->cfg.family = SHLM_FAMILY_COUNT, "config field family");
    EDIT(h->cfg.rope_scaling = SHLM_ROPE_LINEAR + 1, "config field rope_scaling");
    EDIT(h->cfg.rope_scaling = SHLM_ROPE_YARN, "config field rope_factor/orig_ctx"); /* factor 0 */
    /* the extension's fields in their ranges */
    EDIT(h->cfgx.attn_softcap = -50.0f, "config field attn_softcap is -50: expected 0 or a number");
    EDIT(h->cfgx.final_softcap = NAN, "config field final_softcap is nan");
    EDIT(h->cfgx.query_scale = NAN, "config field query_scale is nan");
    EDIT(h->cfgx.logit_scale = -4.0f, "config field logit_scale is -4");
    EDIT(h->cfgx.window_pattern = 2, "config field window_pattern is 2");
    EDIT((h->cfgx.window = 4, h->cfgx.window_pattern = 1), "config field window_pattern is 1");
    EDIT(h->cfgx.reserved[3] = 1, "reserved[3]");
    /* DeepSeek's: latent attention's sizes against the heads', routing without experts */
    EDIT(h->cfgx.kv_lora_rank = 8, "config fields q_lora_rank/kv_lora_rank/rope_dim/v_head_dim");
    EDIT((h->cfgx.kv_lora_rank = 64, h->cfgx.rope_dim = 4, h->cfgx.v_head_dim = 16),
         "a key per head"); /* stories260K has 4 of 8 heads for keys */
    EDIT(h->cfgx.route_scale = -1.0f, "config field route_scale is -1");
    EDIT(h->cfgx.shared_ffn = 32, "config fields shared_ffn/route_scale");
    EDIT(h->cfgx.n_groups = 4, "config fields n_groups/topk_groups");
    EDIT(h->cfg.flags = SHLM_CF_SEL_BIAS, "selection bias without experts");
    EDIT((h->cfg.n_kv_heads = h->cfg.n_heads, h->cfgx.kv_lora_rank = 64, h->cfgx.rope_dim = 4,
          h->cfgx.v_head_dim = 16, h->cfgx.nope_interval = 1),
         "latent attention (kv_lora_rank 64) with");
    EDIT((h->cfgx.n_experts = 16, h->cfgx.n_experts_used = 4, h->cfgx.expert_ffn = 8,
          h->cfgx.moe_route = SHLM_ROUTE_SIGMOID_NORM, h->cfgx.n_groups = 16,
          h->cfgx.topk_groups = 4),
         "sigmoid routing scores a group by its two best experts");
#undef EDIT
    /* in range they load: Gemma's window pattern, local RoPE base and soft-caps, Granite's
     * multipliers, SmolLM3's layers without RoPE, YaRN */
    memcpy(b, good, len);
    h->cfgx.attn_softcap = 50.0f;
    h->cfgx.final_softcap = 30.0f;
    h->cfgx.window_pattern = 2;
    h->cfgx.rope_theta_local = 10000.0f;
    h->cfgx.window = 4096;
    h->cfgx.query_scale = 0.1f;
    h->cfgx.resid_mult = 0.25f;
    h->cfgx.logit_scale = 4.0f;
    h->cfgx.nope_interval = 4;
    h->cfgx.yarn_beta_fast = 32.0f;
    h->cfgx.rope_attn_factor = 1.2f;
    h->cfg.rope_scaling = SHLM_ROPE_YARN;
    h->cfg.rope_factor = 4.0f;
    h->cfg.rope_orig_ctx = 256;
    reseal(b);
    struct shlm_model xm;
    struct shardlm_err xerr;
    assert_int_equal(shlm_parse(&xm, b, len, "x.shlm", &xerr), 0);
    /* a file made before the tables (no family, no flags, no extension) loads */
    memcpy(b, good, len);
    h->cfg.family = 0;
    reseal(b);
    struct shlm_model old;
    struct shardlm_err oerr;
    assert_int_equal(shlm_parse(&old, b, len, "x.shlm", &oerr), 0);
    memcpy(b, good, len);
    h->tok_bytes = len;
    reseal(b);
    expect_refused(b, len, "tok_offset/tok_bytes");
    memcpy(b, good, len);
    h->layout = SHLM_LAYOUT_TILES; /* tiles only exist in weights segments */
    reseal(b);
    expect_refused(b, len, "layout is 1, expected 0 in a model file");
    memcpy(b, good, len);
    h->layout = 7;
    reseal(b);
    expect_refused(b, len, "layout is 7");

    memcpy(b, good, len);
    t = (struct shlm_tensor *)(b + h->table_offset);
    t[3].offset = len; /* past the end with its size */
    reseal(b);
    expect_refused(b, len, "outside the data region");
    memcpy(b, good, len);
    t[3].offset = t[4].offset; /* two tensors on one place */
    t[3].bytes = t[4].bytes;
    reseal(b);
    expect_refused(b, len, "");
    memcpy(b, good, len);
    memcpy(t[5].name, t[6].name, SHLM_NAME_MAX); /* duplicate, so one is missing */
    reseal(b);
    expect_refused(b, len, "appears twice");
    memcpy(b, good, len);
    memset(t[2].name, 'a', SHLM_NAME_MAX); /* unterminated */
    reseal(b);
    expect_refused(b, len, "not terminated");
    memcpy(b, good, len);
    t[2].dtype = 77;
    reseal(b);
    expect_refused(b, len, "unknown dtype");
    memcpy(b, good, len);
    t[2].bytes += 1;
    reseal(b);
    expect_refused(b, len, "bytes, expected");

    /* data corruption passes the structural parse, fails verification */
    memcpy(b, good, len);
    b[t[7].offset + 3] ^= 0x10;
    struct shlm_model m;
    struct shardlm_err err;
    assert_int_equal(shlm_parse(&m, b, len, "x.shlm", &err), 0);
    assert_int_equal(shlm_verify_data(&m, "x.shlm", &err), -EIO);
    assert_non_null(strstr(err.msg, t[7].name));
    free(b);
    free(good);
}

/* A separate classifier (negative vocab_size in the llama2.c header) is read from the end of
 * the checkpoint: here 2x the embedding, which must change the head and nothing else. */
static void test_untied_classifier(void **state)
{
    size_t len = 0;
    char *ck = tu_slurp(stories(), &len);
    assert_non_null(ck);
    size_t emb = 512 * 64 * sizeof(float);
    char *u = malloc(len + emb);
    memcpy(u, ck, len);
    int32_t neg = -512;
    memcpy(u + 20, &neg, 4);
    float *cls = (float *)(u + len), *src = (float *)(ck + 28);
    for (size_t i = 0; i < emb / 4; i++)
        cls[i] = 2.0f * src[i];
    char path[4300], out[4300];
    tu_path(path, sizeof(path), "%s/untied.bin", dir);
    tu_path(out, sizeof(out), "%s/untied.shlm", dir);
    assert_int_equal(tu_write(path, u, len + emb), 0);

    struct coord_llama2c l;
    struct shardlm_err e;
    assert_int_equal(coord_llama2c_open(&l, path, &e), 0);
    assert_false(l.cfg.tied_embd);
    assert_int_equal(l.cfg.vocab_size, 512);
    assert_true(coord_llama2c_tensor(&l, SHLM_KIND_OUTPUT, 0)[5] == 2.0f * src[5]);
    coord_llama2c_close(&l);

    convert_to(path, out, SHLM_SCHEME_F32, 0, 8);
    size_t ml = 0;
    char *mb = tu_slurp(out, &ml);
    struct shlm_model m;
    struct shardlm_err err;
    assert_int_equal(shlm_parse(&m, mb, ml, out, &err), 0);
    const struct shlm_tensor *o = shlm_find(&m, "output");
    assert_non_null(o);
    assert_true(((const float *)(m.base + o->offset))[5] == 2.0f * src[5]);
    /* the shared-classifier file was one classifier short: the untied header must not open it */
    memcpy(ck + 20, &neg, 4);
    assert_int_equal(tu_write(path, ck, len), 0);
    assert_int_equal(coord_llama2c_open(&l, path, &e), -EINVAL);
    free(mb);
    free(u);
    free(ck);
}

/* The hashes' values, which files already made carry: shlm_fnv1a() is FNV-1a 64 (the
 * reference's test vectors), shlm_hash() as it was when they were written, whole or in pieces. */
/* The tensor table: names that parse back to their kind, the file order of the architectures
 * made before it, the shapes and splits of the optional kinds, the architecture rows. */
static void test_tensor_table(void **state)
{
    for (int k = 0; k < SHLM_KIND_COUNT; k++) {
        char nm[SHLM_NAME_MAX], g[96];
        enum shlm_kind kind;
        uint32_t l, x;
        shlm_kind_name((enum shlm_kind)k, 3, 5, nm, sizeof(nm));
        assert_true(shlm_kind_parse(nm, 4, 6, &kind, &l, &x));
        assert_int_equal(kind, k);
        assert_int_equal(l, shlm_kinds[k].layer ? 3 : 0);
        assert_int_equal(x, shlm_kinds[k].expert ? 5 : 0);
        assert_int_equal(shlm_kinds[k].layer, k >= SHLM_KIND_FIRST_LAYER);
        if (shlm_kinds[k].layer)
            assert_false(shlm_kind_parse(nm, 3, 6, &kind, &l, &x)); /* layer 3 of 3 */
        if (shlm_kinds[k].expert)
            assert_false(shlm_kind_parse(nm, 4, 5, &kind, &l, &x)); /* expert 5 of 5 */
        shlm_kind_gguf_name(NULL, (enum shlm_kind)k, 3, g, sizeof(g));
        assert_non_null(strstr(g, shlm_kinds[k].layer ? "blk.3." : ""));
    }
    enum shlm_kind kind;
    uint32_t l, ex;
    static const char *const bad[] = {"blk.07.attn_q",
                                      "blk..attn_q",
                                      "blk.0.nonsense",
                                      "output_x",
                                      "blk.0",
                                      "attn_q",
                                      "blk.0.ffn_gate_exp",
                                      "blk.0.ffn_gate_exp.",
                                      "blk.0.ffn_gate_exp.01",
                                      "blk.0.ffn_gate_exp.1x",
                                      "blk.0.attn_q.1",
                                      "blk.0.ffn_gate_exp.1.2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (shlm_kind_parse(bad[i], 8, 8, &kind, &l, &ex))
            fail_msg("%s parsed", bad[i]);

    /* every kind an architecture made before the table has, in the order its files hold them */
    /* clang-format off */
    struct shlm_config c = {.arch = SHLM_ARCH_LLAMA, .dim = 64, .hidden_dim = 96, .n_layers = 2,
        .n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .vocab_size = 100, .seq_len = 64,
        .norm_eps = 1e-5f, .rope_theta = 1e4f, .qkv_bias = 1, .head_gate = 1};
    /* clang-format on */
    static const char *const order[] = {"tok_embd",          "output",
                                        "output_norm",       "blk.0.attn_norm",
                                        "blk.0.attn_q",      "blk.0.attn_k",
                                        "blk.0.attn_v",      "blk.0.attn_q_bias",
                                        "blk.0.attn_k_bias", "blk.0.attn_v_bias",
                                        "blk.0.attn_gate",   "blk.0.attn_o",
                                        "blk.0.ffn_norm",    "blk.0.ffn_gate",
                                        "blk.0.ffn_up",      "blk.0.ffn_down",
                                        "blk.1.attn_norm"};
    struct shlm_tensor_spec sp[64];
    int n = shlm_expected_tensors(&c, &(struct shlm_config_ext){0}, SHLM_SCHEME_W4A8, 64, 8, NULL,
                                  sp, 64);
    assert_int_equal(n, 3 + 2 * 13);
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        assert_string_equal(sp[i].name, order[i]);
    assert_int_equal(sp[0].dtype, KN_DT_Q8);
    assert_int_equal(sp[4].dtype, KN_DT_W4A8);
    assert_int_equal(sp[10].rows, 4); /* the head gate: heads x dim, f32 */
    assert_int_equal(sp[10].dtype, KN_DT_F32);
    assert_int_equal(shlm_expected_tensors(&c, &(struct shlm_config_ext){0}, SHLM_SCHEME_F32, 0, 8,
                                           NULL, sp, n - 1),
                     -E2BIG);

    /* q/k norms: (1, head_dim) f32 after the biases, replicated over the ranks */
    c.qkv_bias = c.head_gate = 0;
    c.flags = SHLM_CF_QK_NORM;
    c.tied_embd = 1;
    n = shlm_expected_tensors(&c, &(struct shlm_config_ext){0}, SHLM_SCHEME_BF16, 0, 8, NULL, sp,
                              64);
    assert_int_equal(n, 2 + 2 * 11);
    assert_string_equal(sp[2].name, "blk.0.attn_norm");
    assert_string_equal(sp[6].name, "blk.0.attn_q_norm");
    assert_string_equal(sp[7].name, "blk.0.attn_k_norm");
    assert_string_equal(sp[8].name, "blk.0.attn_o");
    assert_int_equal(sp[6].kind, SHLM_KIND_ATTN_Q_NORM);
    assert_int_equal(sp[7].layer, 0);
    assert_string_equal(sp[2 + 11 + 4].name, "blk.1.attn_q_norm");
    assert_int_equal(sp[2 + 11 + 4].layer, 1);
    assert_int_equal(sp[6].rows, 1);
    assert_int_equal(sp[6].cols, 8);
    assert_int_equal(sp[6].dtype, KN_DT_F32);
    assert_int_equal(sp[3].dtype, KN_DT_BF16);
    struct seg_plan p;
    assert_int_equal(seg_plan_make(&p, &c, &(struct shlm_config_ext){0}, 64, 2, 1), 0);
    n = shlm_expected_tensors(&c, &(struct shlm_config_ext){0}, SHLM_SCHEME_W4A16, 64, 4, &p, sp,
                              64);
    assert_int_equal(n, 2 + 2 * 11);
    assert_int_equal(sp[3].rows, 2 * 8);        /* our two query heads */
    assert_int_equal(sp[4].rows, 8);            /* our KV head */
    assert_int_equal(sp[6].cols, 8);            /* the q norm, whole */
    assert_int_equal(sp[8].cols, p.o_pad + 16); /* O: our heads' columns behind the pad */
    assert_int_equal(p.o_pad, 16);
    assert_int_equal(sp[12].cols, p.down_pad + 48); /* down */
    assert_int_equal(sp[0].rows, 100);              /* the embedding, whole */

    /* LongRoPE's factors: global (1, head_dim / 2) f32 tensors after the output norm */
    c.rope_scaling = SHLM_ROPE_LONGROPE;
    n = shlm_expected_tensors(&c, &(struct shlm_config_ext){0}, SHLM_SCHEME_F32, 0, 8, NULL, sp,
                              64);
    assert_int_equal(n, 4 + 2 * 11);
    assert_string_equal(sp[2].name, "rope_factors_short");
    assert_string_equal(sp[3].name, "rope_factors_long");
    assert_int_equal(sp[3].cols, 4);
    assert_string_equal(sp[4].name, "blk.0.attn_norm");
    /* GGUF's rope_freqs (Llama 3.1): one global (1, head_dim / 2) f32 tensor */
    c.rope_scaling = SHLM_ROPE_FREQS;
    n = shlm_expected_tensors(&c, &(struct shlm_config_ext){0}, SHLM_SCHEME_F32, 0, 8, NULL, sp,
                              64);
    assert_int_equal(n, 3 + 2 * 11);
    assert_string_equal(sp[2].name, "rope_freqs");
    assert_int_equal(sp[2].cols, 4);
    c.rope_scaling = SHLM_ROPE_NONE;

    /* Phi-3's fused tensors: q, k, v rows stacked in attn_qkv; gate, then up in ffn_up; none in
     * an architecture whose row has no fused tensors */
    char fname[96];
    int row0, total;
    assert_false(
        shlm_kind_fused(&c, SHLM_KIND_ATTN_K, 3, false, fname, sizeof(fname), &row0, &total));
    uint32_t family = c.family;
    c.family = SHLM_FAMILY_PHI3;
    assert_true(
        shlm_kind_fused(&c, SHLM_KIND_ATTN_K, 3, false, fname, sizeof(fname), &row0, &total));
    assert_string_equal(fname, "blk.3.attn_qkv.weight");
    assert_int_equal(row0, (int)(c.n_heads * c.head_dim));
    assert_int_equal(total, (int)((c.n_heads + 2 * c.n_kv_heads) * c.head_dim));
    assert_true(
        shlm_kind_fused(&c, SHLM_KIND_FFN_UP, 0, true, fname, sizeof(fname), &row0, &total));
    assert_string_equal(fname, "model.layers.0.mlp.gate_up_proj.weight");
    assert_int_equal(row0, (int)c.hidden_dim);
    assert_int_equal(total, 2 * (int)c.hidden_dim);
    assert_false(
        shlm_kind_fused(&c, SHLM_KIND_ATTN_O, 0, false, fname, sizeof(fname), &row0, &total));
    c.family = family;

    /* architectures: qwen3 has q/k norms; the refused ones say why; names are unique */
    const struct shlm_arch_traits *a = shlm_arch_gguf("qwen3", 5);
    assert_non_null(a);
    assert_ptr_equal(a, shlm_arch_hf("Qwen3ForCausalLM"));
    assert_int_equal(a->flags, SHLM_CF_QK_NORM);
    assert_null(a->refused);
    assert_null(shlm_arch_hf("Gemma2ForCausalLM")->refused);
    assert_null(shlm_arch_gguf("gemma3", 6)->refused);
    assert_int_equal(shlm_arch_gguf("gemma3", 6)->flags, SHLM_CF_POST_NORMS | SHLM_CF_QK_NORM);
    assert_null(shlm_arch_gguf("phi3", 4)->refused);
    assert_null(shlm_arch_hf("GraniteForCausalLM")->refused);
    assert_null(shlm_arch_gguf("smollm3", 7)->refused);
    assert_null(shlm_arch_hf("MistralForCausalLM")->refused);
    /* the MoE families the runtime has; the others stay unknown (refused with the list) */
    assert_int_equal(shlm_arch_gguf("qwen3moe", 8)->moe, SHLM_MOE_REQUIRED);
    assert_int_equal(shlm_arch_hf("MixtralForCausalLM")->moe, SHLM_MOE_REQUIRED);
    assert_int_equal(shlm_arch_gguf("llama", 5)->moe, SHLM_MOE_OPTIONAL);
    assert_int_equal(shlm_arch_hf("LlamaForCausalLM")->moe, SHLM_MOE_OPTIONAL);
    /* DeepSeek: latent attention, always experts */
    assert_true(shlm_arch_gguf("deepseek2", 9)->mla);
    assert_int_equal(shlm_arch_hf("DeepseekV3ForCausalLM")->moe, SHLM_MOE_REQUIRED);
    assert_ptr_equal(shlm_arch_hf("DeepseekV2ForCausalLM"), shlm_arch_gguf("deepseek2", 9));
    assert_null(shlm_arch_gguf("deepseek", 8));
    assert_null(shlm_arch_hf("DeepseekV32ForCausalLM"));
    /* gpt-oss: its checkpoint's experts fused (source_hf.c) */
    assert_int_equal(shlm_arch_hf("GptOssForCausalLM")->hf_moe, SHLM_HF_MOE_GPTOSS);
    assert_null(shlm_arch_gguf("gpt-oss", 7)->refused);
    /* Gemma 2: even layers windowed; Gemma 3: five of every six */
    struct shlm_config_ext x = {.window = 32};
    shlm_arch_apply_ext(shlm_arch_gguf("gemma2", 6), &x);
    assert_true(shlm_layer_windowed(&x, 0) && !shlm_layer_windowed(&x, 1) &&
                shlm_layer_windowed(&x, 24) && !shlm_layer_windowed(&x, 25));
    assert_true(x.rope_theta_local == 0.0f);
    shlm_arch_apply_ext(shlm_arch_gguf("gemma3", 6), &x);
    for (uint32_t l = 0; l < 12; l++)
        assert_int_equal(shlm_layer_windowed(&x, l), l != 5 && l != 11);
    assert_true(x.rope_theta_local == 10000.0f);
    /* Mistral, Phi-3: every layer windowed */
    shlm_arch_apply_ext(shlm_arch_hf("MistralForCausalLM"), &x);
    assert_true(shlm_layer_windowed(&x, 0) && shlm_layer_windowed(&x, 5));
    x.window = 0; /* no window: every layer global */
    assert_false(shlm_layer_windowed(&x, 0));
    assert_null(shlm_arch_gguf("qwen", 4));
    for (int i = 0; i < SHLM_FAMILY_COUNT; i++)
        for (int j = 0; j < i; j++) {
            const struct shlm_arch_traits *x = &shlm_archs[i], *y = &shlm_archs[j];
            assert_false(x->gguf && y->gguf && !strcmp(x->gguf, y->gguf));
            assert_false(x->hf && y->hf && !strcmp(x->hf, y->hf));
        }
    char names[256];
    shlm_arch_list(false, names, sizeof(names));
    assert_string_equal(
        names,
        "llama, qwen2, gemma, spark, qwen3, gemma2, gemma3, phi3, granite, smollm3, qwen3moe, "
        "gpt-oss, deepseek2");
}

static void test_hash_values(void **state)
{
    assert_true(shlm_fnv1a(SHLM_FNV_OFFSET, "", 0) == 0xcbf29ce484222325ull);
    assert_true(shlm_fnv1a(SHLM_FNV_OFFSET, "a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(shlm_fnv1a(SHLM_FNV_OFFSET, "foobar", 6) == 0x85944171f73967e8ull);
    assert_true(shlm_fnv1a(shlm_fnv1a(SHLM_FNV_OFFSET, "foo", 3), "bar", 3) ==
                0x85944171f73967e8ull);
    const char *s = "The quick brown fox jumps over the lazy dog";
    static const struct {
        size_t n;
        uint64_t h;
    } want[] = {{0, 0xcbf29ce484222325ull}, {1, 0xaf64094c86023902ull},
                {7, 0xcc0ce71093e2e652ull}, {8, 0xc8395a4064efe33aull},
                {9, 0x2957b46b839f5032ull}, {43, 0x0d97aa5f5531d72cull}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        assert_true(shlm_hash(s, want[i].n) == want[i].h);
        struct shlm_hasher h;
        shlm_hash_init(&h);
        for (size_t k = 0; k < want[i].n; k += 3)
            shlm_hash_update(&h, s + k, want[i].n - k < 3 ? want[i].n - k : 3);
        assert_true(shlm_hash_final(&h) == want[i].h);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_scheme), cmocka_unit_test(test_corruptions),
        cmocka_unit_test(test_untied_classifier),      cmocka_unit_test(test_hash_values),
        cmocka_unit_test(test_tensor_table),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
