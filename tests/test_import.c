/* SPDX-License-Identifier: MIT */
/* Imports end to end: `shardlm synth` writes a small GGUF, `shardlm convert` turns it into an f32
 * .shlm, and `shardlm eval` compares the engine's logits with a direct reference forward written
 * here from the GGUF weights (plain loops, no shardlm kernels): llama (interleaved RoPE, GQA,
 * SiLU, tied), spark (head_dim != dim / heads, GELU-tanh, per-head output gate), granite (its
 * multipliers) and phi3 (fused tensors, LongRoPE's long and short factors), at one and two
 * workers; the architecture shapes from GGUF and Hugging Face
 * folders against ik_llama.cpp's logits (tests/data/golden). Also what synth and convert report:
 * their progress callbacks (the library prints nothing) and the exact lines the CLI prints from
 * them; synth with a tokenizer.json of its own (synth_tok.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "convert.h"
#include "fault.h"
#include "gguf.h"
#include "kn.h"
#include "model.h"
#include "synth.h"
#include "synth_tok.h"
#include "testutil.h"
#include "tokenizer.h"

static char dir[4096];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "import");
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

struct ref_model {
    struct gguf_file f;
    int dim, layers, heads, hd, kv, ffn, vocab;
    bool gelu, gate;
    float theta, eps;
    /* Granite's multipliers as transformers applies them (0: none): embeddings times emb,
     * scores times attn instead of 1 / sqrt(hd), each block's output times res before the add,
     * logits divided by logit */
    float emb, attn, res, logit;
    /* Phi-3: q/k/v rows in attn_qkv and gate/up in ffn_up; NeoX RoPE; an untied head;
     * LongRoPE's factors (rf: head_dim / 2 divisors) and cos/sin magnitude (mscale; 0: 1) */
    bool fused, neox, untied;
    float *rf, mscale;
    const float *freq; /* head_dim / 2 frequencies computed by the caller (YaRN); NULL: theta's */
    int window;        /* position p attends to t > p - window (Mistral); 0: all */
};

static float *tensor(struct ref_model *m, const char *fmt, int l)
{
    char name[96];
    snprintf(name, sizeof(name), fmt, l);
    const struct gguf_tensor *t = gguf_tensor(&m->f, name);
    assert_non_null(t);
    uint64_t n = gguf_tensor_rows(t) * t->dims[0];
    float *out = malloc(n * sizeof(float));
    struct shardlm_err e;
    assert_int_equal(gguf_read_rows(&m->f, t, 0, gguf_tensor_rows(t), out, &e), 0);
    return out;
}

static void matvec(const float *w, const float *x, float *y, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        float s = 0;
        for (int c = 0; c < cols; c++)
            s += w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / n + eps);
    for (int i = 0; i < n; i++)
        o[i] = w[i] * (ss * x[i]);
}

/* logits (n, vocab) of tokens 0..n-1 through the reference model */
static void reference(struct ref_model *m, const int32_t *tok, int n, float *logits)
{
    int D = m->dim, Q = m->heads * m->hd, KV = m->kv * m->hd;
    float *emb = tensor(m, "token_embd.weight", 0), *onorm = tensor(m, "output_norm.weight", 0);
    float *head = m->untied ? tensor(m, "output.weight", 0) : emb;
    float ms = m->mscale ? m->mscale : 1.0f;
    float *kc = calloc((size_t)m->layers * n * KV, 4), *vc = calloc((size_t)m->layers * n * KV, 4);
    float x[256], xb[256], q[256], k[256], v[256], att[256], o[256], h1[512], h3[512], sc[600];
    for (int p = 0; p < n; p++) {
        memcpy(x, emb + (size_t)tok[p] * D, D * 4);
        for (int i = 0; m->emb && i < D; i++)
            x[i] *= m->emb;
        for (int l = 0; l < m->layers; l++) {
            float *an = tensor(m, "blk.%d.attn_norm.weight", l);
            float *wo = tensor(m, "blk.%d.attn_output.weight", l),
                  *fn = tensor(m, "blk.%d.ffn_norm.weight", l);
            float *wd = tensor(m, "blk.%d.ffn_down.weight", l);
            float *wq, *wk, *wv, *wg, *wu;
            if (m->fused) { /* rows q, k, v; gate, up */
                wq = tensor(m, "blk.%d.attn_qkv.weight", l);
                wk = wq + (size_t)Q * D;
                wv = wk + (size_t)KV * D;
                wg = tensor(m, "blk.%d.ffn_up.weight", l);
                wu = wg + (size_t)m->ffn * D;
            } else {
                wq = tensor(m, "blk.%d.attn_q.weight", l);
                wk = tensor(m, "blk.%d.attn_k.weight", l);
                wv = tensor(m, "blk.%d.attn_v.weight", l);
                wg = tensor(m, "blk.%d.ffn_gate.weight", l);
                wu = tensor(m, "blk.%d.ffn_up.weight", l);
            }
            float *gt = m->gate ? tensor(m, "blk.%d.attn_gate.weight", l) : NULL;
            rmsnorm(xb, x, an, D, m->eps);
            matvec(wq, xb, q, Q, D);
            matvec(wk, xb, k, KV, D);
            matvec(wv, xb, v, KV, D);
            /* RoPE: llama in GGUF rotates adjacent pairs; spark (ours) NeoX halves */
            for (int pass = 0; pass < 2; pass++) {
                float *vec = pass ? k : q;
                int nh = pass ? m->kv : m->heads;
                for (int hh = 0; hh < nh; hh++)
                    for (int i = 0; i < m->hd; i += 2) {
                        float fr = 1.0f / powf(m->theta, (float)i / m->hd);
                        float a = p * (m->freq ? m->freq[i / 2] : m->rf ? fr / m->rf[i / 2] : fr);
                        bool neox = m->gate || m->neox;
                        int i0 = neox ? hh * m->hd + i / 2 : hh * m->hd + i;
                        int i1 = neox ? i0 + m->hd / 2 : i0 + 1;
                        float v0 = vec[i0], v1 = vec[i1];
                        vec[i0] = (v0 * cosf(a) - v1 * sinf(a)) * ms;
                        vec[i1] = (v0 * sinf(a) + v1 * cosf(a)) * ms;
                    }
            }
            memcpy(kc + ((size_t)l * n + p) * KV, k, KV * 4);
            memcpy(vc + ((size_t)l * n + p) * KV, v, KV * 4);
            for (int hh = 0; hh < m->heads; hh++) {
                int kvh = hh / (m->heads / m->kv);
                int t0 = m->window && p >= m->window ? p - m->window + 1 : 0;
                float mx = -INFINITY, sum = 0;
                for (int t = t0; t <= p; t++) {
                    float s = 0;
                    for (int i = 0; i < m->hd; i++)
                        s += q[hh * m->hd + i] * kc[((size_t)l * n + t) * KV + kvh * m->hd + i];
                    sc[t] = m->attn ? s * m->attn : s / sqrtf((float)m->hd);
                    mx = fmaxf(mx, sc[t]);
                }
                for (int t = t0; t <= p; t++)
                    sum += sc[t] = expf(sc[t] - mx);
                float g = 1.0f;
                if (gt) {
                    float s = 0;
                    for (int i = 0; i < D; i++)
                        s += gt[(size_t)hh * D + i] * xb[i];
                    g = 1.0f / (1.0f + expf(-s));
                }
                for (int i = 0; i < m->hd; i++) {
                    float a = 0;
                    for (int t = t0; t <= p; t++)
                        a += sc[t] / sum * vc[((size_t)l * n + t) * KV + kvh * m->hd + i];
                    att[hh * m->hd + i] = a * g;
                }
            }
            matvec(wo, att, o, D, Q);
            for (int i = 0; i < D; i++)
                x[i] += m->res ? m->res * o[i] : o[i];
            rmsnorm(xb, x, fn, D, m->eps);
            matvec(wg, xb, h1, m->ffn, D);
            matvec(wu, xb, h3, m->ffn, D);
            for (int i = 0; i < m->ffn; i++) {
                float a = h1[i];
                a = m->gelu ? 0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)))
                            : a / (1.0f + expf(-a));
                h1[i] = a * h3[i];
            }
            matvec(wd, h1, o, D, m->ffn);
            for (int i = 0; i < D; i++)
                x[i] += m->res ? m->res * o[i] : o[i];
            free(an), free(wq), free(wo), free(fn), free(wg), free(wd);
            if (!m->fused)
                free(wk), free(wv), free(wu);
            free(gt);
        }
        rmsnorm(xb, x, onorm, D, m->eps);
        matvec(head, xb, logits + (size_t)p * m->vocab, m->vocab, D);
        for (int i = 0; m->logit && i < m->vocab; i++)
            logits[(size_t)p * m->vocab + i] /= m->logit;
    }
    if (m->untied)
        free(head);
    free(emb), free(onorm), free(kc), free(vc);
}

static int run(char *const argv[], struct tu_run *r)
{
    char env[4200];
    tu_path(env, sizeof(env), "SHARDLM_RUNTIME_DIR=%s/run", dir);
    char *envp[] = {env, NULL};
    tu_run_cmd(r, argv, envp, 300, NULL, NULL);
    if (r->status)
        fprintf(stderr, "%s failed (%d): %s\n", argv[1], r->status, r->err);
    return r->status;
}

/* The kld and top1 of eval's last line ("overall kld=... top1=... ppl=..."). */
static void eval_overall(const struct tu_run *r, double *kld, double *top1)
{
    double ppl;
    const char *last = strstr(r->out, "overall ");
    assert_non_null(last);
    assert_int_equal(sscanf(last, "overall kld=%lf top1=%lf ppl=%lf", kld, top1, &ppl), 3);
}

/* Tokens the reference runs: REF_N of them. */
enum { REF_N = 40 };

/* The reference's logits of REF_N tokens into @ref (ref.logits.f32, made here) with a greedy.tsv
 * naming them (its line into @line, 1024 bytes). Returns the logits (free them). */
static float *ref_write(struct ref_model *m, const char *ref, char *line)
{
    char path[4400];
    int32_t tok[REF_N];
    for (int i = 0; i < REF_N; i++)
        tok[i] = (int32_t)((i * 37 + 11) % m->vocab);
    float *logits = malloc((size_t)REF_N * m->vocab * sizeof(float));
    reference(m, tok, REF_N, logits);
    mkdir(ref, 0755);
    tu_path(path, sizeof(path), "%s/ref.logits.f32", ref);
    assert_int_equal(tu_write(path, logits, (size_t)REF_N * m->vocab * sizeof(float)), 0);
    strcpy(line, "synthetic\t"); /* 5 "prompt" ids, then the rest as "generated" */
    for (int i = 0; i < REF_N; i++)
        sprintf(line + strlen(line), "%s%d", i == 0 ? "" : i == 5 ? "\t" : " ", tok[i]);
    strcat(line, "\tnone.txt\tref.logits.f32\n");
    tu_path(path, sizeof(path), "%s/greedy.tsv", ref);
    assert_int_equal(tu_write(path, line, strlen(line)), 0);
    return logits;
}

/* @shlm against the reference logits in @ref at one and two workers: the same to rounding. */
static void eval_ref(struct tu_run *r, const char *shlm, const char *ref, const char *what)
{
    for (int workers = 1; workers <= 2; workers++) {
        char cpus[16];
        snprintf(cpus, sizeof(cpus), workers == 1 ? "0" : "0:0");
        char *ev[] = {(char *)tu_bin(), "eval",   "-m", (char *)shlm, "--ref",
                      (char *)ref,      "--cpus", cpus, NULL};
        assert_int_equal(run(ev, r), 0);
        double kld, top1;
        eval_overall(r, &kld, &top1);
        fprintf(stderr, "%s: %d worker(s): kld %.3g top1 %.4f against the reference forward\n",
                what, workers, kld, top1);
        assert_true(kld < 1e-6);
        assert_true(top1 == 1.0);
    }
}

/* @shape of architecture @arch converted (with its context capped at @ctx where not NULL)
 * against the reference forward of its GGUF's weights. */
static void check_shape(const char *shape, const char *arch, bool gelu, bool gate, const char *ctx)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], shlm[4300], ref[4300], path[4400], tag[96];
    snprintf(tag, sizeof(tag), "%s%s%s", shape, ctx ? "-ctx" : "", ctx ? ctx : "");
    tu_path(gguf, sizeof(gguf), "%s/%s.gguf", dir, tag);
    tu_path(shlm, sizeof(shlm), "%s/%s.shlm", dir, tag);
    tu_path(ref, sizeof(ref), "%s/%s-ref", dir, tag);
    char *synth[] = {(char *)tu_bin(), "synth", "--shape", (char *)shape, "-o", gguf, NULL};
    assert_int_equal(run(synth, r), 0);
    char *conv[] = {(char *)tu_bin(),     "convert",   gguf, "--scheme", "f32", "-o", shlm, "-q",
                    ctx ? "--ctx" : NULL, (char *)ctx, NULL};
    assert_int_equal(run(conv, r), 0);

    /* inspect reads both */
    char *in1[] = {(char *)tu_bin(), "inspect", gguf, NULL};
    assert_int_equal(run(in1, r), 0);
    assert_non_null(strstr(r->out, "GGUF version 3"));
    assert_non_null(strstr(r->out, "tokenizer.ggml.model = \"gpt2\""));
    /* a file's strings reach the terminal escaped: the chat template's newline as \n */
    assert_non_null(strstr(r->out, "{{ m.content | trim }}\\n{%"));
    char *in2[] = {(char *)tu_bin(), "inspect", shlm, NULL};
    assert_int_equal(run(in2, r), 0);
    assert_non_null(strstr(r->out, "config: dim 64"));
    bool untied = !strcmp(arch, "phi3");
    assert_non_null(strstr(r->out, gate     ? "+head-gate"
                                   : untied ? "embeddings untied"
                                            : "embeddings tied"));
    assert_non_null(strstr(r->out, "32.000 bits per weight")); /* f32 */
    if (!strcmp(arch, "granite")) /* the multipliers the forward applies */
        assert_non_null(
            strstr(r->out, "\n        residual x0.25, logits /4\nattention: score scale 0.1\n"));
    /* synth writes a chat template into the GGUF; convert carries it into the .shlm */
    assert_non_null(strstr(r->out, "\nchat template: 138 bytes"));

    /* phi3: fused tensors, NeoX q/k (llama.cpp permutes only llama's), untied */
    struct ref_model m = {
        .gelu = gelu, .gate = gate, .fused = untied, .neox = untied, .untied = untied};
    struct shardlm_err e;
    assert_int_equal(gguf_open(&m.f, gguf, &e), 0);
    const struct gguf_tensor *emb = gguf_tensor(&m.f, "token_embd.weight");
    m.dim = (int)emb->dims[0];
    m.vocab = (int)emb->dims[1];
    char key[96];
    snprintf(key, sizeof(key), "%s.feed_forward_length", arch);
    assert_int_equal(gguf_get_u32(&m.f, key, (uint32_t *)&m.ffn), 0);
    snprintf(key, sizeof(key), "%s.attention.head_count", arch);
    assert_int_equal(gguf_get_u32(&m.f, key, (uint32_t *)&m.heads), 0);
    snprintf(key, sizeof(key), "%s.attention.head_count_kv", arch);
    assert_int_equal(gguf_get_u32(&m.f, key, (uint32_t *)&m.kv), 0);
    snprintf(key, sizeof(key), "%s.block_count", arch);
    assert_int_equal(gguf_get_u32(&m.f, key, (uint32_t *)&m.layers), 0);
    snprintf(key, sizeof(key), "%s.attention.key_length", arch);
    assert_int_equal(gguf_get_u32(&m.f, key, (uint32_t *)&m.hd), 0);
    static const char *const mults[] = {"embedding_scale", "attention.scale", "residual_scale",
                                        "logit_scale"};
    float *mult[] = {&m.emb, &m.attn, &m.res, &m.logit};
    for (int i = 0; i < 4; i++) { /* absent: 0, none */
        snprintf(key, sizeof(key), "%s.%s", arch, mults[i]);
        gguf_get_f32(&m.f, key, mult[i]);
    }
    /* LongRoPE: the long factors where the context exceeds the original one, else the short */
    uint32_t orig = 0;
    snprintf(key, sizeof(key), "%s.rope.scaling.original_context_length", arch);
    if (gguf_get_u32(&m.f, key, &orig) == 0) {
        bool lng = !ctx || (uint32_t)atoi(ctx) > orig;
        m.rf = tensor(&m, lng ? "rope_factors_long.weight" : "rope_factors_short.weight", 0);
        snprintf(key, sizeof(key), "%s.rope.scaling.attn_factor", arch);
        assert_int_equal(gguf_get_f32(&m.f, key, &m.mscale), 0);
    }
    m.theta = 10000.0f;
    m.eps = 1e-5f;

    char line[1024];
    float *logits = ref_write(&m, ref, line);
    gguf_close(&m.f);
    eval_ref(r, shlm, ref, shape);

    /* the same reference as float16 (a .logits.f16 file): within its rounding; --save writes
     * this model's logits in float16 under that name too, the reference's bytes again */
    char ref16[4300], save16[4300];
    tu_path(ref16, sizeof(ref16), "%s/%s-ref16", dir, tag);
    tu_path(save16, sizeof(save16), "%s/%s-save16", dir, tag);
    mkdir(ref16, 0755);
    uint16_t *h = malloc((size_t)REF_N * m.vocab * sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)REF_N * m.vocab; i++)
        h[i] = kn_f32_to_f16(logits[i]);
    tu_path(path, sizeof(path), "%s/ref.logits.f16", ref16);
    assert_int_equal(tu_write(path, h, (size_t)REF_N * m.vocab * sizeof(uint16_t)), 0);
    char *tab = strrchr(line, '\t');
    strcpy(tab, "\tref.logits.f16\n");
    tu_path(path, sizeof(path), "%s/greedy.tsv", ref16);
    assert_int_equal(tu_write(path, line, strlen(line)), 0);
    char *ev16[] = {(char *)tu_bin(), "eval", "-m", shlm, "--ref", ref16, "--save", save16, NULL};
    assert_int_equal(run(ev16, r), 0);
    double kld, top1;
    eval_overall(r, &kld, &top1);
    assert_true(kld < 1e-5);
    assert_true(top1 == 1.0);
    tu_path(path, sizeof(path), "%s/ref.logits.f16", save16);
    size_t saved_len;
    uint16_t *saved = (uint16_t *)tu_slurp(path, &saved_len);
    assert_non_null(saved);
    assert_int_equal(saved_len, (size_t)REF_N * m.vocab * sizeof(uint16_t));
    int differ = 0; /* this model's logits round as the reference's, but for a last-bit tie */
    for (size_t i = 0; i < (size_t)REF_N * m.vocab; i++)
        differ += saved[i] != h[i];
    assert_true(differ < REF_N * m.vocab / 100);
    free(saved);
    free(h);
    free(logits);
    free(m.rf);
    free(r);
}

static void test_tiny_llama(void **state) { check_shape("tiny", "llama", false, false, NULL); }
static void test_tiny_spark(void **state) { check_shape("tiny-spark", "spark", true, true, NULL); }
/* Phi-3's fused tensors split at import and LongRoPE's factors: the long ones at the file's
 * context (4096 > 256 original positions), the short ones with the context capped at 256 */
static void test_tiny_phi3(void **state)
{
    check_shape("tiny-phi3", "phi3", false, false, NULL);
    check_shape("tiny-phi3", "phi3", false, false, "256");
}
/* Granite's multipliers against the reference forward: ik_llama.cpp's tiny-granite logits
 * (tests/data/golden) are not a reference for it, as ik (8337e4cd3) scales the residual stream
 * with the block's output added (x = r (x + f(x))), not the block's output alone (transformers'
 * GraniteDecoderLayer, llama.cpp's llm_build_granite: x = x + r f(x)) */
static void test_tiny_granite(void **state)
{
    check_shape("tiny-granite", "granite", false, false, NULL);
}

/* @shape with f32 weights as the GGUF @gguf and as the Hugging Face folder @hf. */
static void synth_both(struct tu_run *r, const char *shape, const char *gguf, const char *hf)
{
    char *sg[] = {(char *)tu_bin(), "synth", "--shape", (char *)shape, "--type", "f32", "-o",
                  (char *)gguf,     NULL};
    char *sh[] = {(char *)tu_bin(), "synth",    "--shape", (char *)shape, "--type", "f32",
                  "--hf",           (char *)hf, NULL};
    assert_int_equal(run(sg, r), 0);
    assert_int_equal(run(sh, r), 0);
}

/* @shape from its GGUF and from its Hugging Face folder against ik_llama.cpp's logits for the
 * same weights (tests/data/golden/<shape>, 300-token sequences, longer than every window):
 * within the bounds (mean KLD <= 1e-4, top-1 >= 99.5%) at one and two ranks. Each
 * converted file's inspect output has every one of @inspect_lines (NULL-terminated; NULL: none
 * checked). */
static void check_ik(const char *shape, const char *const *inspect_lines)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], hf[4300], shlm[4300], ref[4300];
    tu_path(gguf, sizeof(gguf), "%s/%s-ik.gguf", dir, shape);
    tu_path(hf, sizeof(hf), "%s/%s-ikhf", dir, shape);
    tu_path(shlm, sizeof(shlm), "%s/%s-ik.shlm", dir, shape);
    tu_path(ref, sizeof(ref), "%s/golden/%s", tu_data(), shape);
    synth_both(r, shape, gguf, hf); /* f32 weights, as the references were made */
    const char *srcs[] = {gguf, hf};
    for (int i = 0; i < 2; i++) {
        char *conv[] = {(char *)tu_bin(),
                        "convert",
                        (char *)srcs[i],
                        "--scheme",
                        "f32",
                        "-o",
                        shlm,
                        "-q",
                        NULL};
        assert_int_equal(run(conv, r), 0);
        char *in[] = {(char *)tu_bin(), "inspect", shlm, NULL};
        assert_int_equal(run(in, r), 0);
        for (const char *const *l = inspect_lines; l && *l; l++)
            if (!strstr(r->out, *l))
                fail_msg("%s: inspect lacks '%s': %s", shape, *l, r->out);
        for (int R = 1; R <= 2; R++) {
            char *ev[] = {(char *)tu_bin(),     "eval", "-m", shlm, "--ref", ref, "--cpus",
                          R == 1 ? "0" : "0:0", NULL};
            assert_int_equal(run(ev, r), 0);
            double kld, top1;
            eval_overall(r, &kld, &top1);
            fprintf(stderr, "%s (%s) R=%d against ik_llama.cpp: kld %.3g top1 %.4f\n", shape,
                    i ? "HF" : "GGUF", R, kld, top1);
            assert_true(kld <= 1e-4);
            assert_true(top1 >= 0.995);
        }
        unlink(shlm);
    }
    free(r);
}

/* per-head q/k RMSNorm before RoPE */
static void test_tiny_qwen3_ik(void **state)
{
    static const char *const lines[] = {"architecture: llama-family +qk-norm\n", NULL};
    check_ik("tiny-qwen3", lines);
}
/* pre/post norms, (1 + w) norms, sqrt(dim) embeddings, attention and final soft-caps (1, 30),
 * windows of 32 on even layers, GELU-tanh */
static void test_tiny_gemma2_ik(void **state)
{
    static const char *const lines[] = {
        "architecture: llama-family +embedding-scale +post-norms\n",
        "\nattention: window 32 on 13 of 26 layers, score soft-cap 1, logit soft-cap 30\n", NULL};
    check_ik("tiny-gemma2", lines);
}
/* and q/k norms, 5 local (window 48, RoPE base 1e4) : 1 global (1e6) layers, no soft-caps */
static void test_tiny_gemma3_ik(void **state)
{
    static const char *const lines[] = {
        "architecture: llama-family +embedding-scale +qk-norm +post-norms\n",
        "\nattention: window 48 on 7 of 8 layers, their rope theta 10000\n", NULL};
    check_ik("tiny-gemma3", lines);
}
/* fused qkv and gate_up split at import, LongRoPE's long factors (context 4096 > 256) and its
 * attention factor, a window of 64 */
static void test_tiny_phi3_ik(void **state)
{
    static const char *const lines[] = {
        "(neox, longrope scaling)", "\n        rope attention factor 1.22474\n",
        "\nattention: window 64 on 4 of 4 layers\n", NULL};
    check_ik("tiny-phi3", lines);
}
/* no RoPE on every fourth layer */
static void test_tiny_smollm3_ik(void **state)
{
    static const char *const lines[] = {"\n        no RoPE on every 4-th layer\n", NULL};
    check_ik("tiny-smollm3", lines);
}
/* head_dim != dim / heads, no window (sliding_window null; GGUF llama has none) */
static void test_tiny_mistral_ik(void **state) { check_ik("tiny-mistral", NULL); }
/* llama3 RoPE scaling: config.json's rope_scaling, the GGUF's rope_freqs tensor */
static void test_tiny_llama31_ik(void **state) { check_ik("tiny-llama31", NULL); }

/* @shape's GGUF (@gguf) and Hugging Face folder (@hf) at f32, config.json's @field set to @value
 * (taken), the folder converted to @shlm at f32. */
static void hf_edit_convert(struct tu_run *r, const char *shape, const char *field, json_t *value,
                            const char *gguf, const char *hf, const char *shlm)
{
    char path[4400];
    synth_both(r, shape, gguf, hf);
    tu_path(path, sizeof(path), "%s/config.json", hf);
    json_t *cfg = json_load_file(path, 0, NULL);
    assert_non_null(cfg);
    json_object_set_new(cfg, field, value);
    assert_int_equal(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    char *conv[] = {(char *)tu_bin(), "convert", (char *)hf, "--scheme", "f32", "-o",
                    (char *)shlm,     "-q",      NULL};
    assert_int_equal(run(conv, r), 0);
}

/* @shape's Hugging Face folder with config.json's @field set to @value (taken) against the
 * reference forward of the same weights from its GGUF (llama metadata, untied), which @tune
 * fits to the edit. */
static void check_hf_edit(const char *shape, const char *field, json_t *value,
                          void (*tune)(struct ref_model *m), const char *what)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], hf[4300], shlm[4300], ref[4300];
    tu_path(gguf, sizeof(gguf), "%s/%s-edit.gguf", dir, shape);
    tu_path(hf, sizeof(hf), "%s/%s-edit-hf", dir, shape);
    tu_path(shlm, sizeof(shlm), "%s/%s-edit.shlm", dir, shape);
    tu_path(ref, sizeof(ref), "%s/%s-edit-ref", dir, shape);
    hf_edit_convert(r, shape, field, value, gguf, hf, shlm);

    struct ref_model m = {.untied = true, .eps = 1e-5f};
    struct shardlm_err e;
    assert_int_equal(gguf_open(&m.f, gguf, &e), 0);
    const struct gguf_tensor *emb = gguf_tensor(&m.f, "token_embd.weight");
    m.dim = (int)emb->dims[0];
    m.vocab = (int)emb->dims[1];
    assert_int_equal(gguf_get_u32(&m.f, "llama.block_count", (uint32_t *)&m.layers), 0);
    assert_int_equal(gguf_get_u32(&m.f, "llama.attention.key_length", (uint32_t *)&m.hd), 0);
    assert_int_equal(gguf_get_u32(&m.f, "llama.attention.head_count", (uint32_t *)&m.heads), 0);
    assert_int_equal(gguf_get_u32(&m.f, "llama.attention.head_count_kv", (uint32_t *)&m.kv), 0);
    assert_int_equal(gguf_get_u32(&m.f, "llama.feed_forward_length", (uint32_t *)&m.ffn), 0);
    assert_int_equal(gguf_get_f32(&m.f, "llama.rope.freq_base", &m.theta), 0);
    tune(&m);
    char line[1024];
    float *logits = ref_write(&m, ref, line);
    gguf_close(&m.f);
    eval_ref(r, shlm, ref, what);
    free(logits);
    free(r);
}

/* transformers' YaRN (_compute_yarn_parameters) in double for factor 4 over 64 original
 * positions: pair 0 extrapolated, 1 mixed, 2.. interpolated; magnitude 0.1 ln 4 + 1 */
static float yarn_freq[64];
static void tune_yarn(struct ref_model *m)
{
    double th = m->theta, pi = 3.14159265358979323846, factor = 4.0, orig = 64.0;
    double lo = fmax(0.0, floor(m->hd * log(orig / (32 * 2 * pi)) / (2 * log(th))));
    double hi = fmin(m->hd - 1.0, ceil(m->hd * log(orig / (1 * 2 * pi)) / (2 * log(th))));
    if (lo == hi)
        hi += 0.001;
    for (int i = 0; i < m->hd / 2; i++) {
        double ext = 1.0 / pow(th, 2.0 * i / m->hd);
        double ramp = fmin(1.0, fmax(0.0, (i - lo) / (hi - lo)));
        yarn_freq[i] = (float)(ext / factor * ramp + ext * (1.0 - ramp));
    }
    m->freq = yarn_freq;
    m->mscale = (float)(0.1 * log(factor) + 1.0);
}

/* YaRN from a Hugging Face config (Qwen2.5's rope_scaling) on tiny-llama31's weights */
static void test_yarn_hf(void **state)
{
    check_hf_edit("tiny-llama31", "rope_scaling",
                  json_pack("{s:s, s:f, s:i}", "rope_type", "yarn", "factor", 4.0,
                            "original_max_position_embeddings", 64),
                  tune_yarn, "tiny-llama31 with yarn (HF)");
}

/* transformers' linear scaling (position interpolation): every frequency divided by 8 */
static float linear_freq[64];
static void tune_linear(struct ref_model *m)
{
    for (int i = 0; i < m->hd / 2; i++)
        linear_freq[i] = 1.0f / powf(m->theta, (float)(2 * i) / m->hd) / 8.0f;
    m->freq = linear_freq;
}

/* linear RoPE scaling from a Hugging Face config (factor 8) on tiny-llama31's weights: every
 * layer's positions divided by 8 (was refused) */
static void test_linear_hf(void **state)
{
    check_hf_edit("tiny-llama31", "rope_scaling",
                  json_pack("{s:s, s:f}", "rope_type", "linear", "factor", 8.0), tune_linear,
                  "tiny-llama31 with linear scaling 8 (HF)");
}

/* Gemma 3 4B..27B's linear scaling (factor 8): on the global layers only, as transformers'
 * rotary_emb (its rotary_emb_local at rope_local_base_freq has none) and ik_llama.cpp's
 * freq_scale (1 on the windowed layers): tiny-gemma3's folder so edited, converted, and the
 * worker's RoPE table of each layer compared with the plain tables at each base. */
static void test_gemma3_linear_hf(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], hf[4300], shlm[4300];
    tu_path(gguf, sizeof(gguf), "%s/gemma3-linear.gguf", dir);
    tu_path(hf, sizeof(hf), "%s/gemma3-linear-hf", dir);
    tu_path(shlm, sizeof(shlm), "%s/gemma3-linear.shlm", dir);
    hf_edit_convert(r, "tiny-gemma3", "rope_scaling",
                    json_pack("{s:s, s:f}", "rope_type", "linear", "factor", 8.0), gguf, hf, shlm);
    size_t len = 0;
    char *image = tu_slurp(shlm, &len);
    assert_non_null(image);
    struct shlm_model img;
    struct shardlm_err e;
    assert_int_equal(shlm_parse(&img, image, len, shlm, &e), 0);
    const struct shlm_config *c = &img.hdr->cfg;
    assert_int_equal(c->rope_scaling, SHLM_ROPE_LINEAR);
    struct wrk_model m;
    assert_int_equal(wrk_model_init(&m, &img, kn_ops_select(NULL, NULL, 0), 16, NULL, NULL), 0);
    float global[64], local[64];
    int half = (int)c->head_dim / 2;
    kn_rope_freqs(global, (int)c->head_dim, c->rope_theta, NULL);
    kn_rope_freqs(local, (int)c->head_dim, 10000.0f, NULL);
    int windowed = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        bool w = (l + 1) % 6 != 0; /* 5 local : 1 global */
        windowed += w;
        for (int i = 0; i < half; i++)
            if (m.layers[l].rope_freqs[i] != (w ? local[i] : global[i] / 8.0f))
                fail_msg("layer %u (%s) frequency %d: %g, expected %g", l, w ? "local" : "global",
                         i, (double)m.layers[l].rope_freqs[i],
                         (double)(w ? local[i] : global[i] / 8.0f));
    }
    assert_int_equal(windowed, 7);
    wrk_model_free(&m);
    free(image);
    free(r);
}

static void tune_window(struct ref_model *m) { m->window = 16; }

/* Mistral's sliding window from config.json (every layer; 16 of the 40 positions) */
static void test_mistral_window_hf(void **state)
{
    check_hf_edit("tiny-mistral", "sliding_window", json_integer(16), tune_window,
                  "tiny-mistral with a window of 16 (HF)");
}

/* Progress calls recorded: (done, total) pairs. */
struct calls {
    int n;
    int done[64], total[64];
};

static void record(void *ctx, int done, int total)
{
    struct calls *c = ctx;
    assert_true(c->n < 64);
    c->done[c->n] = done;
    c->total[c->n++] = total;
}

/* (0, n), (1, n), ..., (n, n) */
static void expect_counter(const struct calls *c, int n)
{
    assert_int_equal(c->n, n + 1);
    for (int i = 0; i <= n; i++) {
        assert_int_equal(c->done[i], i);
        assert_int_equal(c->total[i], n);
    }
}

static void test_progress_callbacks(void **state)
{
    char gguf[4300], shlm[4300];
    struct shardlm_err e;
    struct calls c = {0};
    tu_path(gguf, sizeof(gguf), "%s/cb.gguf", dir);
    assert_int_equal(coord_synth("tiny", gguf, 1, record, &c, &e), 0);
    expect_counter(&c, 2); /* tiny has 2 layers */
    assert_int_equal(coord_synth("nope", gguf, 1, record, &c, &e), -EINVAL);
    assert_string_equal(e.msg, "unknown shape 'nope'");
    size_t n_shapes;
    const struct coord_synth_shape *shapes = coord_synth_shapes(&n_shapes);
    assert_true(n_shapes >= 2);
    assert_string_equal(shapes[0].name, "tiny");

    /* convert: the counter over the tensors, and what it wrote */
    static const struct { enum shlm_scheme s; int group; } cases[] = {
        {SHLM_SCHEME_F32, 0}, {SHLM_SCHEME_W4A8, 128}, {SHLM_SCHEME_W4A16, 64}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tu_path(shlm, sizeof(shlm), "%s/cb%zu.shlm", dir, i);
        memset(&c, 0, sizeof(c));
        struct coord_convert_opts o = {.checkpoint = gguf, .out = shlm, .scheme = cases[i].s,
                                       .head_bits = 8, .progress = record, .progress_ctx = &c};
        struct coord_convert_info info = {0};
        int rc = coord_convert(&o, &info, &e);
        if (rc)
            fprintf(stderr, "%s\n", e.msg);
        assert_int_equal(rc, 0);
        assert_true(info.n_tensors > 2);
        expect_counter(&c, info.n_tensors);
        assert_int_equal(info.group, cases[i].group);
        struct stat st;
        assert_int_equal(stat(shlm, &st), 0);
        assert_int_equal(info.file_bytes, (uint64_t)st.st_size);
    }
    /* a failed conversion reports no tensor it did not write */
    memset(&c, 0, sizeof(c));
    struct coord_convert_opts bad = {.checkpoint = gguf, .out = shlm, .scheme = SHLM_SCHEME_W4A8,
                                     .group = 100, .head_bits = 8, .progress = record,
                                     .progress_ctx = &c};
    assert_int_equal(coord_convert(&bad, NULL, &e), -EINVAL);
    assert_string_equal(e.msg, "--group 100: expected a multiple of 32 from 32 to 256");
    assert_int_equal(c.n, 0);
}

/* The lines on stderr, as before the callbacks: synth's and convert's (not a terminal: no
 * counter, no carriage return; synth's layer line every 5 s and the last), nothing with -q. */
static void test_progress_text(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], shlm[4300], want[9000];
    tu_path(gguf, sizeof(gguf), "%s/text.gguf", dir);
    tu_path(shlm, sizeof(shlm), "%s/text.shlm", dir);
    char *synth[] = {(char *)tu_bin(), "synth", "--shape", "tiny", "-o", gguf, NULL};
    assert_int_equal(run(synth, r), 0);
    assert_string_equal(r->err, "shardlm synth: layer 2/2\n");
    assert_int_equal(r->out_len, 0);

    char *conv[] = {(char *)tu_bin(), "convert", gguf, "--scheme", "w4a8", "-o", shlm, NULL};
    assert_int_equal(run(conv, r), 0);
    struct stat st;
    assert_int_equal(stat(shlm, &st), 0);
    tu_path(want, sizeof(want), "shardlm convert: wrote %s: w4a8 group 128 head int8, 20 tensors, "
            "%lld bytes, ", shlm, (long long)st.st_size);
    assert_memory_equal(r->err, want, strlen(want));
    const char *tail = r->err + strlen(want);
    char *end;
    double secs = strtod(tail, &end);
    assert_true(end > tail && secs >= 0.0 && secs < 60.0);
    assert_string_equal(end, " s\n");
    assert_int_equal(r->out_len, 0);

    char *quiet[] = {(char *)tu_bin(), "convert", gguf, "--scheme", "f32", "-q", "-o", shlm, NULL};
    assert_int_equal(run(quiet, r), 0);
    assert_int_equal(r->err_len, 0);
    assert_int_equal(r->out_len, 0);
    free(r);
}

/* --group: every multiple of 32 from 32 to 256 (the .shlm format takes them, the kernels any
 * even group), said so by the message and --help; the others refused before any work. */
static void test_group_sizes(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], shlm[4300];
    tu_path(gguf, sizeof(gguf), "%s/group.gguf", dir);
    tu_path(shlm, sizeof(shlm), "%s/group.shlm", dir);
    char *synth[] = {(char *)tu_bin(), "synth", "--shape", "tiny", "-o", gguf, NULL};
    assert_int_equal(run(synth, r), 0);
    static const char *const bad[] = {"100", "16", "288", "0", "-32"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *conv[] = {(char *)tu_bin(), "convert",      gguf, "--scheme", "w4a16",
                        "--group",        (char *)bad[i], "-o", shlm,       NULL};
        char want[128];
        snprintf(want, sizeof(want),
                 "shardlm convert: --group '%s': expected a multiple of 32 from 32 to 256\n",
                 bad[i]);
        tu_run_cmd(r, conv, NULL, 60, NULL, NULL); /* refused before any runtime file */
        assert_int_equal(r->status, 2);
        assert_memory_equal(r->err, want, strlen(want));
        assert_int_equal(access(shlm, F_OK), -1);
    }
    static const char *const good[][2] = {{"w4a16", "96"}, {"w4a8", "160"}, {"w4a8", "224"}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char *conv[] = {(char *)tu_bin(), "convert",          gguf, "--scheme", (char *)good[i][0],
                        "--group",        (char *)good[i][1], "-o", shlm,       NULL};
        assert_int_equal(run(conv, r), 0);
        char want[64];
        snprintf(want, sizeof(want), ": %s group %s head int8, ", good[i][0], good[i][1]);
        assert_non_null(strstr(r->err, want));
        char *inspect[] = {(char *)tu_bin(), "inspect", shlm, NULL};
        assert_int_equal(run(inspect, r), 0);
        snprintf(want, sizeof(want), "scheme: %s, group %s, ", good[i][0], good[i][1]);
        assert_non_null(strstr(r->out, want));
    }
    char *help[] = {(char *)tu_bin(), "convert", "--help", NULL};
    assert_int_equal(run(help, r), 0);
    assert_non_null(
        strstr(r->out, "--group N       int4 group size, a multiple of 32 from 32 to 256"));
    free(r);
}

/* Descriptors this process has open (the count's own included, the same each time). */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* A failed output (@o's) leaves no descriptor open, no temporary beside it and no file: the
 * conversion returned @rc with the message "<out>: @why". */
static void expect_no_output(const struct coord_convert_opts *o, int fds, int rc, int want_rc,
                             const struct shardlm_err *e, const char *why)
{
    char want[4400];
    tu_path(want, sizeof(want), "%s: %s", o->out, why);
    assert_int_equal(rc, want_rc);
    assert_string_equal(e->msg, want);
    assert_int_equal(open_fds(), fds);
    assert_int_equal(access(o->out, F_OK), -1);
    char cmd[4400], out[32];
    tu_path(cmd, sizeof(cmd), "ls -A '%s' | grep -c '\\.tmp\\.'", dir);
    tu_cmd_output(cmd, out, sizeof(out));
    assert_int_equal(atoi(out), 0);
}

/* The output's error paths, in process: a failed fsync (the fault site) and a failed ftruncate
 * (RLIMIT_FSIZE) each close the temporary file and remove it; the next conversion succeeds. */
static void test_output_errors(void **state)
{
    char gguf[4300], shlm[4300];
    struct shardlm_err e;
    tu_path(gguf, sizeof(gguf), "%s/out.gguf", dir);
    tu_path(shlm, sizeof(shlm), "%s/out.shlm", dir);
    assert_int_equal(coord_synth("tiny", gguf, 1, NULL, NULL, &e), 0);
    struct coord_convert_opts o = {.checkpoint = gguf, .out = shlm, .scheme = SHLM_SCHEME_W4A8,
                                   .head_bits = 8};
    int fds = open_fds();

    shardlm_fault_arm(SHARDLM_FAULT_FSYNC, 1);
    int rc = coord_convert(&o, NULL, &e);
    assert_true(shardlm_fault_fired(SHARDLM_FAULT_FSYNC));
    shardlm_fault_arm(SHARDLM_FAULT_FSYNC, 0);
    expect_no_output(&o, fds, rc, -EIO, &e, "Input/output error");

    struct rlimit old, small = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small.rlim_max = old.rlim_max;
    void (*old_xfsz)(int) = signal(SIGXFSZ, SIG_IGN); /* EFBIG instead of the signal */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    rc = coord_convert(&o, NULL, &e);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_xfsz);
    expect_no_output(&o, fds, rc, -EFBIG, &e, "File too large");

    assert_int_equal(coord_convert(&o, NULL, &e), 0);
    assert_int_equal(open_fds(), fds);
    assert_int_equal(access(shlm, F_OK), 0);
}

/* A small byte-level tokenizer.json (a hole at id 4, an added special token) and its
 * tokenizer_config.json: synth --tokenizer writes them into the GGUF (the same ids, EOS and
 * template back; no BOS, as the config says; the hole named [PAD4]) and synth --hf copies them
 * byte for byte into the folder; a missing file, an unknown token and a pre-tokenizer no GGUF
 * names fail with the file and the field. */
static void test_synth_tokenizer(void **state)
{
    static const char json[] =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2,"
        " \"\\u0120\": 3}, \"merges\": [\"a b\"]},"
        " \"added_tokens\": [{\"id\": 5, \"content\": \"<|im_end|>\", \"special\": true}],"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}";
    static const char config[] = "{\"bos_token\": null, \"eos_token\": \"<|im_end|>\","
                                 " \"model_max_length\": 1000000000000000019884624838656,"
                                 " \"chat_template\": \"{{ messages[0].content }}\"}";
    char tk[4300], p[4400], gguf[4300], hf[4300];
    struct shardlm_err e;
    tu_path(tk, sizeof(tk), "%s/tk", dir);
    tu_path(hf, sizeof(hf), "%s/hf", dir);
    tu_path(gguf, sizeof(gguf), "%s/tk.gguf", dir);
    assert_int_equal(mkdir(tk, 0700), 0);
    assert_int_equal(mkdir(hf, 0700), 0);
    struct coord_synth_tok st;
    assert_int_equal(coord_synth_tok_load(&st, tk, &e), -ENOENT);
    assert_non_null(strstr(e.msg, "tk/tokenizer.json"));
    tu_path(p, sizeof(p), "%s/tokenizer.json", tk);
    assert_int_equal(tu_write(p, json, strlen(json)), 0);
    tu_path(p, sizeof(p), "%s/tokenizer_config.json", tk);
    assert_int_equal(tu_write(p, config, strlen(config)), 0);
    assert_int_equal(coord_synth_tok_load(&st, tk, &e), 0);
    assert_int_equal(st.vocab, 6);
    assert_int_equal(st.bos, -1);
    assert_int_equal(st.eos, 5);
    assert_string_equal(st.pre, "gpt2");
    struct coord_synth_opts o = {.shape = "tiny", .out = gguf, .seed = 1, .tok = &st};
    assert_int_equal(coord_synth_write(&o, &e), 0);

    size_t n = 0;
    char *img = tu_slurp(gguf, &n);
    assert_non_null(img);
    struct coord_tok t;
    assert_int_equal(coord_tok_from_image(&t, (const uint8_t *)img, n, 0, gguf, &e), 0);
    free(img);
    assert_int_equal(t.vocab_size, 6);
    assert_int_equal(t.bos_id, -1);
    assert_int_equal(t.eos_id, 5);
    assert_string_equal(t.vocab[4], "[PAD4]");
    assert_string_equal(t.chat_template, "{{ messages[0].content }}");
    int32_t want[16], got[16];
    const char *text = "ab a<|im_end|>b";
    unsigned fl = COORD_TOK_ENC_PARSE_SPECIAL;
    int nw = coord_tok_encode_ex(&st.tok, text, strlen(text), fl, want, 16);
    assert_int_equal(nw, 5); /* ab, Ġ, a, <|im_end|>, b */
    assert_int_equal(coord_tok_encode_ex(&t, text, strlen(text), fl, got, 16), nw);
    assert_memory_equal(got, want, sizeof(int32_t) * (size_t)nw);
    coord_tok_free(&t);

    struct coord_synth_opts oh = {.shape = "tiny-qwen3", .out = hf, .hf = true, .tok = &st};
    assert_int_equal(coord_synth_write(&oh, &e), 0);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    const char *bytes[] = {json, config};
    for (int i = 0; i < 2; i++) {
        tu_path(p, sizeof(p), "%s/%s", hf, files[i]);
        char *b = tu_slurp(p, &n);
        assert_non_null(b);
        assert_int_equal(n, strlen(bytes[i]));
        assert_memory_equal(b, bytes[i], n);
        free(b);
    }
    coord_synth_tok_free(&st);

    static const char bad_config[] = "{\"bos_token\": \"<nope>\"}";
    tu_path(p, sizeof(p), "%s/tokenizer_config.json", tk);
    assert_int_equal(tu_write(p, bad_config, strlen(bad_config)), 0);
    assert_int_equal(coord_synth_tok_load(&st, tk, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "tokenizer_config.json: bos_token '<nope>' is no token"));
    static const char split[] =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
        "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a+\"}, \"behavior\": \"Isolated\"},"
        "{\"type\": \"ByteLevel\", \"use_regex\": false}]}}";
    tu_path(p, sizeof(p), "%s/tokenizer.json", tk);
    assert_int_equal(tu_write(p, split, strlen(split)), 0);
    assert_int_equal(coord_synth_tok_load(&st, tk, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "tokenizer.json: pre_tokenizer: its Split regexes are none"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_callbacks),
        cmocka_unit_test(test_progress_text),
        cmocka_unit_test(test_group_sizes),
        cmocka_unit_test(test_output_errors),
        cmocka_unit_test(test_tiny_llama),
        cmocka_unit_test(test_tiny_spark),
        cmocka_unit_test(test_tiny_granite),
        cmocka_unit_test(test_tiny_phi3),
        cmocka_unit_test(test_yarn_hf),
        cmocka_unit_test(test_linear_hf),
        cmocka_unit_test(test_gemma3_linear_hf),
        cmocka_unit_test(test_mistral_window_hf),
        cmocka_unit_test(test_tiny_qwen3_ik),
        cmocka_unit_test(test_tiny_gemma2_ik),
        cmocka_unit_test(test_tiny_gemma3_ik),
        cmocka_unit_test(test_tiny_phi3_ik),
        cmocka_unit_test(test_tiny_smollm3_ik),
        cmocka_unit_test(test_tiny_mistral_ik),
        cmocka_unit_test(test_tiny_llama31_ik),
        cmocka_unit_test(test_synth_tokenizer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
