/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth.c: the synthetic model maker of `shardlm synth` - models at real
 * sizes, seeded random weights, GGUF F16 or F32 (or a Hugging Face folder: synth_hf.c), with a
 * valid byte-level BPE vocabulary, so benchmarks need no download and each architecture has a
 * small model that exercises its features. The files load in llama.cpp / ik_llama.cpp unchanged:
 * the metadata keys and tensor names are theirs (ik's llama-arch.cpp, llama-hparams.cpp). */
#include "synth_internal.h"

#include "gguf_write.h"
#include "rows.h"
#include "synth_tok.h"
#include "tensors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tiny architecture shapes: hidden 64, vocab 512, even head counts (KV heads >= 2: tensor
 * parallelism at 2 ranks), windows shorter than the 300-token references, caps and multipliers
 * that bite; weights of rank 16 (coord_synth_shape.rank) at trained models' scales, the final
 * norm's (out_norm) set per shape so that ik_llama.cpp's next-token distributions on the
 * references are peaked (mean top-1 probability >= 0.3; tools/ik_ref) while int4 rounding costs
 * what it costs on a trained model (tests/test_archs.sh's figures). */
#define TINY_WEIGHTS .w_std = 0.06f, .qk_std = 0.08f, .emb_std = 0.5f, .norm_std = 0.1f, .rank = 16
/* one row per shape, its sizes as the first shapes' */
/* clang-format off */
static const struct coord_synth_shape shapes[] = {
    /* a small llama for tests: ragged FFN, GQA, tied */
    {"tiny", "llama", 64, 2, 4, 16, 2, 172, 512, 512, 10000.0f, false, false, .hf_class = NULL},
    /* spark's features small, for tests: head_dim != dim / heads, GELU-tanh, head gate */
    {"tiny-spark", "spark", 64, 2, 4, 32, 2, 172, 512, 512, 10000.0f, true, true, .hf_class = NULL},
    {"llama32-1b", "llama", 2048, 16, 32, 64, 8, 8192, 128256, 131072, 500000.0f, false, false,
     .hf_class = NULL},
    {"spark-1.7b", "spark", 2048, 28, 8, 256, 2, 6656, 131072, 32768, 1000000.0f, true, true,
     .hf_class = NULL},
    {"spark-1.7b-llama", "llama", 2048, 28, 8, 256, 2, 6656, 131072, 32768, 1000000.0f, false,
     false, .hf_class = NULL},
    /* Qwen3: q/k RMSNorm per head, head_dim != dim / heads, tied */
    {"tiny-qwen3", "qwen3", 64, 4, 4, 32, 2, 192, 512, 4096, 1000000.0f, false, false,
     .hf_class = "Qwen3ForCausalLM", .hf_type = "qwen3", .eps = 1e-6f, .qk_norm = true,
     TINY_WEIGHTS, .out_norm = 1.0f},
    /* Gemma 2: 26 layers (ik takes the 2B's query scaling from the layer count), window on even
     * layers, attention and final soft-caps (1: the scores here are of order 1; 30: Gemma 2's
     * own, which the top logits reach), (1 + w) pre/post norms, GELU-tanh */
    {"tiny-gemma2", "gemma2", 64, 26, 4, 32, 2, 256, 512, 4096, 10000.0f, true, false,
     .hf_class = "Gemma2ForCausalLM", .hf_type = "gemma2", .eps = 1e-6f, .gemma = true,
     .window = 32, .window_pattern = 2, .attn_softcap = 1.0f, .final_softcap = 30.0f,
     .query_scalar = 32.0f, TINY_WEIGHTS, .out_norm = 1.4f},
    /* Gemma 3: 5 local (base 10000) : 1 global (base 1e6) layers, q/k norms */
    {"tiny-gemma3", "gemma3", 64, 8, 4, 32, 2, 256, 512, 4096, 1000000.0f, true, false,
     .hf_class = "Gemma3ForCausalLM", .hf_type = "gemma3_text", .eps = 1e-6f, .qk_norm = true,
     .gemma = true, .window = 48, .window_pattern = 6, .theta_local = 10000.0f,
     .query_scalar = 32.0f, TINY_WEIGHTS, .out_norm = 0.85f},
    /* Phi-3.5: fused qkv and gate_up, LongRoPE (original context 256 of 4096), a window */
    {"tiny-phi3", "phi3", 64, 4, 4, 16, 2, 160, 512, 4096, 10000.0f, false, false,
     .hf_class = "Phi3ForCausalLM", .hf_type = "phi3", .eps = 1e-5f, .untied = true,
     .fused = true, .window = 64, .rope = COORD_SYNTH_ROPE_LONGROPE, .rope_orig_ctx = 256,
     TINY_WEIGHTS, .out_norm = 1.0f},
    /* Granite 3.x: embedding, residual and attention multipliers, logit scaling */
    {"tiny-granite", "granite", 64, 4, 4, 16, 2, 160, 512, 4096, 10000.0f, false, false,
     .hf_class = "GraniteForCausalLM", .hf_type = "granite", .eps = 1e-5f, .llama_rope = true,
     .emb_mult = 12.0f, .res_mult = 0.25f, .attn_mult = 0.1f, .logit_scale = 4.0f, TINY_WEIGHTS,
     .out_norm = 4.0f},
    /* SmolLM3: no RoPE on every 4th layer */
    {"tiny-smollm3", "smollm3", 64, 4, 4, 16, 2, 160, 512, 4096, 5000000.0f, false, false,
     .hf_class = "SmolLM3ForCausalLM", .hf_type = "smollm3", .eps = 1e-6f, .llama_rope = true,
     .no_rope_every = 4, TINY_WEIGHTS, .out_norm = 1.0f},
    /* Mistral Nemo: head_dim != dim / heads, untied (ik's llama has no sliding window: none) */
    {"tiny-mistral", "llama", 64, 4, 4, 32, 2, 192, 512, 4096, 1000000.0f, false, false,
     .hf_class = "MistralForCausalLM", .hf_type = "mistral", .eps = 1e-5f, .untied = true,
     .llama_rope = true, TINY_WEIGHTS, .out_norm = 1.0f},
    /* Llama 3.1: rope_scaling llama3 (factor 8, low 1, high 4, original context 256: the factors
     * differ from 1 at head_dim 16 within the references' positions), untied */
    {"tiny-llama31", "llama", 64, 4, 4, 16, 2, 192, 512, 4096, 500000.0f, false, false,
     .hf_class = "LlamaForCausalLM", .hf_type = "llama", .eps = 1e-5f, .untied = true,
     .llama_rope = true, .rope = COORD_SYNTH_ROPE_LLAMA3, .rope_factor = 8.0f, .rope_low = 1.0f,
     .rope_high = 4.0f, .rope_orig_ctx = 256, TINY_WEIGHTS, .out_norm = 1.0f},
    /* Qwen3-MoE: Qwen3's attention, 16 experts of 32 units, 4 per token */
    {"tiny-qwen3moe", "qwen3moe", 64, 4, 4, 32, 2, 192, 512, 4096, 1000000.0f, false, false,
     .hf_class = "Qwen3MoeForCausalLM", .hf_type = "qwen3_moe", .eps = 1e-6f, .qk_norm = true,
     TINY_WEIGHTS, .out_norm = 1.0f, .experts = 16, .experts_used = 4, .expert_ffn = 32,
     .router_std = 0.25f},
    /* Mixtral: Mistral's attention (llama in GGUF), 8 experts of 64 units, 2 per token,
     * untied */
    {"tiny-mixtral", "llama", 64, 4, 4, 16, 2, 64, 512, 4096, 1000000.0f, false, false,
     .hf_class = "MixtralForCausalLM", .hf_type = "mixtral", .eps = 1e-5f, .untied = true,
     .llama_rope = true, TINY_WEIGHTS, .out_norm = 1.0f, .experts = 8, .experts_used = 2,
     .expert_ffn = 64, .router_std = 0.25f},
    /* many experts (256 of 16 units, 8 per token, in 8 layers: 6144 expert tensors, past the
     * 4096 a table once held), no Hugging Face form */
    {"tiny-moe-wide", "qwen3moe", 64, 8, 4, 16, 2, 64, 512, 512, 1000000.0f, false, false,
     .hf_class = NULL, .eps = 1e-6f, .qk_norm = true, TINY_WEIGHTS, .out_norm = 1.0f,
     .experts = 256, .experts_used = 8,
     .expert_ffn = 16, .router_std = 0.25f},
    /* gpt-oss: biases in attention and experts, sinks, even layers windowed (16), YaRN (factor
     * 16 over an original context of 256: gpt-oss's 32 over 4096), 16 experts of 32 units
     * (MXFP4 values: MXFP4 in the GGUF and, fused as gpt-oss's checkpoints hold them, in the HF
     * folder), 4 per token, the clamped SwiGLU; untied (ik_llama.cpp's gpt-oss requires
     * output.weight) */
    {"tiny-gptoss", "gpt-oss", 64, 4, 4, 32, 2, 32, 512, 4096, 150000.0f, false, false,
     .hf_class = "GptOssForCausalLM", .hf_type = "gpt_oss", .eps = 1e-5f, .untied = true,
     .window = 16, .window_pattern = 2,
     .rope = COORD_SYNTH_ROPE_YARN, .rope_orig_ctx = 256,
     TINY_WEIGHTS, .out_norm = 1.0f, .experts = 16, .experts_used = 4, .expert_ffn = 32,
     .router_std = 0.75f, .bias_std = 0.05f, .sink_mean = 1.0f, .mxfp4 = true},
    /* DeepSeek-V3: latent attention (q through a rank-32 bottleneck, a latent of 64, heads of
     * 32 + 16 roped, values of 32), YaRN (factor 16 over 256, mscale's multiplier 0.1), a dense
     * first layer, 16 experts of 32 units (4 per token, sigmoid routing with a selection bias,
     * renormalised, times 2.5) and a shared one; untied (ik_llama.cpp's deepseek2 requires
     * output.weight) */
    {"tiny-deepseek2", "deepseek2", 64, 4, 4, 48, 4, 128, 512, 4096, 10000.0f, false, false,
     .hf_class = "DeepseekV3ForCausalLM", .hf_type = "deepseek_v3", .eps = 1e-6f, .untied = true, .rope = COORD_SYNTH_ROPE_YARN,
     .rope_orig_ctx = 256, TINY_WEIGHTS, .out_norm = 1.0f, .experts = 16, .experts_used = 4,
     .expert_ffn = 32, .router_std = 0.75f, .q_lora = 32, .kv_lora = 64, .rope_dim = 16,
     .v_dim = 32, .shared = 1, .dense_first = 1, .sel_std = 0.05f, .route_scale = 2.5f,
     .sigmoid = true},
    /* DeepSeek-V2-Lite: 27 layers (ik_llama.cpp tells a Lite by its layer count), q without a
     * bottleneck, softmax routing not renormalised, two shared experts, no RoPE scaling (the
     * scores at head_dim's 1 / sqrt, not the cached row's); the router's rows drawn
     * wider (2: at 0.75 and 1.5, 27 layers of routing met near-ties that the two tools' float
     * orders decided apart, a relative L2 of 2.2e-3..2.5e-3 at one position) */
    {"tiny-deepseek2-lite", "deepseek2", 64, 27, 4, 48, 4, 128, 512, 4096, 10000.0f, false,
     false, .hf_class = "DeepseekV2ForCausalLM", .hf_type = "deepseek_v2", .eps = 1e-6f,
     .untied = true, TINY_WEIGHTS,
     .out_norm = 1.0f, .experts = 16, .experts_used = 4, .expert_ffn = 32, .router_std = 2.0f,
     .kv_lora = 64, .rope_dim = 16, .v_dim = 32, .shared = 2, .dense_first = 1,
     .route_scale = 1.0f},
    /* the perf shapes: real dimensions and vocabularies */
    {"qwen3-1.7b", "qwen3", 2048, 28, 16, 128, 8, 6144, 151936, 40960, 1000000.0f, false, false,
     .hf_class = "Qwen3ForCausalLM", .hf_type = "qwen3", .eps = 1e-6f, .qk_norm = true,
     .w_std = 0.02f, .qk_std = 0.02f, .emb_std = 0.02f, .out_norm = 1.0f},
    {"gemma3-1b", "gemma3", 1152, 26, 4, 256, 1, 6912, 262144, 32768, 1000000.0f, true, false,
     .hf_class = "Gemma3ForCausalLM", .hf_type = "gemma3_text", .eps = 1e-6f, .qk_norm = true,
     .gemma = true, .window = 512, .window_pattern = 6, .theta_local = 10000.0f,
     .query_scalar = 256.0f, .w_std = 0.02f, .qk_std = 0.02f, .emb_std = 0.02f,
     .out_norm = 1.0f},
    /* Qwen3-30B-A3B's dimensions and top-8 routing, with 32 experts instead of 128 and 24
     * layers instead of 48 (its F16 file, ik's copy and ours fit this machine together) */
    {"qwen3moe-a3b-32e", "qwen3moe", 2048, 24, 32, 128, 4, 6144, 151936, 40960, 1000000.0f,
     false, false, .hf_class = "Qwen3MoeForCausalLM", .hf_type = "qwen3_moe", .eps = 1e-6f,
     .qk_norm = true, .w_std = 0.02f, .qk_std = 0.02f, .emb_std = 0.02f, .out_norm = 1.0f,
     .experts = 32, .experts_used = 8, .expert_ffn = 768, .router_std = 0.02f},
};
/* clang-format on */
#undef TINY_WEIGHTS

const struct coord_synth_shape *coord_synth_shapes(size_t *n)
{
    *n = sizeof(shapes) / sizeof(shapes[0]);
    return shapes;
}

const struct coord_synth_shape *coord_synth_shape(const char *name)
{
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        if (strcmp(shapes[i].name, name) == 0)
            return &shapes[i];
    return NULL;
}

/* xorshift64* and Box-Muller: deterministic for a seed (the state is the caller's: two models
 * made at once do not interleave their draws) */
static float uniform(uint64_t *rng)
{
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    return ((float)((*rng * 0x2545F4914F6CDD1Dull) >> 40) + 0.5f) / 16777216.0f;
}

static void fill_normal(uint64_t *rng, float *x, size_t n, float std)
{
    for (size_t i = 0; i + 1 < n; i += 2) {
        float r = sqrtf(-2.0f * logf(uniform(rng))), t = 6.28318531f * uniform(rng);
        x[i] = std * r * cosf(t);
        x[i + 1] = std * r * sinf(t);
    }
    if (n % 2)
        x[n - 1] = std * sqrtf(-2.0f * logf(uniform(rng))) * cosf(6.28318531f * uniform(rng));
}

/* A low-rank tensor's @rows rows (all of them for a writer): rows = coordinates x basis^T for a
 * tensor that reads the stream (@t->cols is the basis' dim), columns = basis x coordinates for
 * one that writes it (its rows are). The coordinates are drawn row by row, or column by column. */
static void draw_low_rank(const struct synth_tensor *t, uint64_t *rng, float *buf, uint64_t rows)
{
    uint32_t k = t->rank;
    float c[64];
    if (!t->writes) {
        for (uint64_t r = 0; r < rows; r++) {
            fill_normal(rng, c, k, t->std);
            for (uint64_t j = 0; j < t->cols; j++) {
                float v = 0.0f;
                for (uint32_t i = 0; i < k; i++)
                    v += c[i] * t->basis[j * k + i];
                buf[r * t->cols + j] = v;
            }
        }
        return;
    }
    float std = t->std * sqrtf((float)rows / (float)k);
    for (uint64_t j = 0; j < t->cols; j++) {
        fill_normal(rng, c, k, std);
        for (uint64_t r = 0; r < rows; r++) {
            float v = 0.0f;
            for (uint32_t i = 0; i < k; i++)
                v += t->basis[r * k + i] * c[i];
            buf[r * t->cols + j] = v;
        }
    }
}

void synth_draw(const struct synth_tensor *t, uint64_t *rng, float *buf, uint64_t rows)
{
    uint64_t n = (t->rows ? rows : 1) * t->cols;
    if (t->basis)
        draw_low_rank(t, rng, buf, rows);
    else if (t->fixed)
        memcpy(buf, t->fixed, n * sizeof(float));
    else if (t->std > 0.0f) {
        fill_normal(rng, buf, n, t->std);
        if (t->mean != 0.0f)
            for (uint64_t i = 0; i < n; i++)
                buf[i] += t->mean;
    } else
        for (uint64_t i = 0; i < n; i++)
            buf[i] = t->mean;
}

/* GPT-2's byte -> printable code point map, as UTF-8. */
static void byte_symbol(int b, char *out)
{
    int cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
        int n = 0; /* the k-th byte outside those ranges maps to 256 + k */
        for (int i = 0; i < b; i++)
            if (!((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

void synth_vocab_free(struct synth_vocab *v)
{
    for (uint32_t k = 0; v->tok && k < v->n; k++)
        free(v->tok[k]);
    for (uint32_t k = 0; v->merges && k < v->n_merges; k++)
        free(v->merges[k]);
    free(v->tok);
    free(v->merges);
    memset(v, 0, sizeof(*v));
}

int synth_vocab_init(struct synth_vocab *v, uint32_t vocab)
{
    uint32_t n_plain = vocab - 2;
    memset(v, 0, sizeof(*v));
    v->n = vocab;
    v->n_merges = n_plain - 256;
    v->bos = n_plain;
    v->eos = n_plain + 1;
    v->tok = calloc(vocab, sizeof(char *));
    v->merges = calloc(v->n_merges, sizeof(char *));
    char sym[256][3];
    if (!v->tok || !v->merges)
        goto oom;
    for (int b = 0; b < 256; b++)
        byte_symbol(b, sym[b]);
    for (uint32_t k = 0; k < n_plain; k++) {
        char t[16], m[16];
        if (k < 256) {
            snprintf(t, sizeof(t), "%.2s", sym[k]);
            m[0] = 0;
        } else if (k < 256 + 65536) {
            uint32_t i = (k - 256) / 256, j = (k - 256) % 256;
            snprintf(t, sizeof(t), "%.2s%.2s", sym[i], sym[j]);
            snprintf(m, sizeof(m), "%.2s %.2s", sym[i], sym[j]);
        } else {
            uint32_t p = (k - 256 - 65536) / 256, j = (k - 256 - 65536) % 256;
            uint32_t i = p / 256, i2 = p % 256;
            snprintf(t, sizeof(t), "%.2s%.2s%.2s", sym[i], sym[i2], sym[j]);
            snprintf(m, sizeof(m), "%.2s%.2s %.2s", sym[i], sym[i2], sym[j]);
        }
        v->tok[k] = strdup(t);
        if (k >= 256)
            v->merges[k - 256] = strdup(m);
        if (!v->tok[k] || (k >= 256 && !v->merges[k - 256]))
            goto oom;
    }
    v->tok[n_plain] = strdup("<|begin_of_text|>");
    v->tok[n_plain + 1] = strdup("<|end_of_text|>");
    if (!v->tok[n_plain] || !v->tok[n_plain + 1])
        goto oom;
    return 0;
oom:
    synth_vocab_free(v);
    return -ENOMEM;
}

/* The vocabulary's keys: tokens, their types (normal; BOS and EOS control), merges, a chat
 * template (so that a synthetic model serves chat requests as an instruct model does). */
static int write_vocab(struct gguf_writer *w, uint32_t vocab)
{
    struct synth_vocab v;
    int32_t *type = calloc(vocab, sizeof(int32_t));
    if (!type || synth_vocab_init(&v, vocab)) {
        free(type);
        return -ENOMEM;
    }
    for (uint32_t k = 0; k < vocab; k++)
        type[k] = k == v.bos || k == v.eos ? 3 : 1;
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "default");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, vocab);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, vocab);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges, v.n_merges);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", v.bos);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", v.eos);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_w_str(w, "tokenizer.chat_template", COORD_SYNTH_CHAT_TEMPLATE);
    synth_vocab_free(&v);
    free(type);
    return 0;
}

/* The RoPE factor tables: Llama 3.1's per-frequency factors as llama.cpp's converter computes
 * them from rope_scaling (into rope_long), Phi-3.5's LongRoPE long and short factors (made up,
 * rising with the frequency index as the real ones do). */
static void rope_tables(struct synth_model *m)
{
    const struct coord_synth_shape *s = m->s;
    uint32_t half = s->head_dim / 2;
    for (uint32_t i = 0; i < half && i < 256; i++) {
        if (s->rope == COORD_SYNTH_ROPE_LONGROPE) {
            m->rope_long[i] = 1.0f + 2.0f * (float)i;
            m->rope_short[i] = 1.0f + 0.1f * (float)i;
        } else if (s->rope == COORD_SYNTH_ROPE_LLAMA3) {
            double freq = pow(s->theta, -2.0 * i / s->head_dim), wavelen = 2 * M_PI / freq;
            double lo = s->rope_orig_ctx / s->rope_low, hi = s->rope_orig_ctx / s->rope_high;
            if (wavelen < hi)
                m->rope_long[i] = 1.0f;
            else if (wavelen > lo)
                m->rope_long[i] = s->rope_factor;
            else {
                double smooth =
                    (s->rope_orig_ctx / wavelen - s->rope_low) / (s->rope_high - s->rope_low);
                m->rope_long[i] = (float)(1.0 / ((1 - smooth) / s->rope_factor + smooth));
            }
        }
    }
}

/* Appends a tensor to @m's list (sized by model_init()'s count), named @gguf and @hf (NULL or
 * "": none in the HF folder). */
static struct synth_tensor *add_named(struct synth_model *m, int layer, const char *gguf,
                                      const char *hf, uint64_t cols, uint64_t rows, float mean,
                                      float std, bool matrix)
{
    KN_ASSERT(m->n < m->cap);
    struct synth_tensor *t = &m->t[m->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->gguf, sizeof(t->gguf), "%s", gguf);
    snprintf(t->hf, sizeof(t->hf), "%s", hf ? hf : "");
    t->cols = cols;
    t->rows = rows;
    t->mean = mean;
    t->std = std;
    t->matrix = matrix;
    t->layer = layer;
    return t;
}

/* Appends the tensor of @kind of @layer (-1: a global kind) and @expert (of an expert's kind) of
 * model config @c, its names the tensor table's (shm/tensors.h). */
static struct synth_tensor *add_expert(struct synth_model *m, const struct shlm_config *c,
                                       enum shlm_kind kind, int layer, uint32_t expert,
                                       uint64_t cols, uint64_t rows, float mean, float std,
                                       bool matrix)
{
    char gguf[sizeof(m->t->gguf)], hf[sizeof(m->t->hf)];
    uint32_t l = layer < 0 ? 0 : (uint32_t)layer;
    shlm_kind_gguf_name(c, kind, l, gguf, sizeof(gguf));
    if (!shlm_kind_hf_name(c, kind, l, expert, hf, sizeof(hf)))
        hf[0] = 0;
    struct synth_tensor *t = add_named(m, layer, gguf, hf, cols, rows, mean, std, matrix);
    t->kind = (int)kind;
    if (shlm_kinds[kind].expert) {
        t->expert = expert;
        t->experts = m->s->experts;
    }
    return t;
}

/* add_expert() of a kind not an expert's */
static struct synth_tensor *add(struct synth_model *m, const struct shlm_config *c,
                                enum shlm_kind kind, int layer, uint64_t cols, uint64_t rows,
                                float mean, float std, bool matrix)
{
    return add_expert(m, c, kind, layer, 0, cols, rows, mean, std, matrix);
}

/* Appends the fused tensor that holds @kind's rows in an architecture with fused tensors (Phi-3:
 * q, k and v; gate and up), its names and rows the tensor table's; NULL where @c has none. */
static struct synth_tensor *add_fused(struct synth_model *m, const struct shlm_config *c,
                                      enum shlm_kind kind, int layer, uint64_t cols, float std)
{
    char gguf[sizeof(m->t->gguf)], hf[sizeof(m->t->hf)];
    int row0, total;
    if (!shlm_kind_fused(c, kind, (uint32_t)layer, false, gguf, sizeof(gguf), &row0, &total) ||
        !shlm_kind_fused(c, kind, (uint32_t)layer, true, hf, sizeof(hf), &row0, &total))
        return NULL;
    return add_named(m, layer, gguf, hf, cols, (uint64_t)total, 0, std, true);
}

/* A norm: N(@mean, norm_std * @mean) in GGUF values; Gemma's draw is the HF w, GGUF 1 + w. */
static void add_norm(struct synth_model *m, const struct shlm_config *c, enum shlm_kind kind,
                     int layer, uint64_t n, float mean)
{
    const struct coord_synth_shape *s = m->s;
    struct synth_tensor *t = add(m, c, kind, layer, n, 0, mean, s->norm_std * mean, false);
    if (s->gemma) {
        t->mean = mean - 1.0f;
        t->gguf_add = 1.0f;
    }
}

/* The model config of shape @s that the tensor table's names and fused rows need: sizes, and
 * the family of its GGUF architecture (post-norms, fused tensors). */
static void shape_config(const struct coord_synth_shape *s, struct shlm_config *c)
{
    memset(c, 0, sizeof(*c));
    c->dim = s->dim;
    c->n_layers = s->layers;
    c->n_heads = s->heads;
    c->n_kv_heads = s->kv_heads;
    c->head_dim = s->head_dim;
    c->hidden_dim = s->ffn;
    c->vocab_size = s->vocab;
    /* the HF architecture's row where there is one (Mixtral's names its experts its own way;
     * the GGUF is "llama") */
    const struct shlm_arch_traits *a = s->hf_class ? shlm_arch_hf(s->hf_class) : NULL;
    if (!a)
        a = shlm_arch_gguf(s->arch, strlen(s->arch));
    if (a)
        shlm_arch_apply(a, false, c);
}

/* @m's basis for a shape of rank > 0: dim x rank orthonormal columns (Gram-Schmidt of normal
 * draws from a stream of its own, so the weights' stream is as it was). Returns 0 or -ENOMEM. */
static int make_basis(struct synth_model *m)
{
    uint32_t d = m->s->dim, k = m->s->rank;
    uint64_t rng = m->seed ^ 0xd1b54a32d192ed03ull;
    float *col = malloc(d * sizeof(float));
    m->basis = malloc((size_t)d * k * sizeof(float));
    if (!col || !m->basis) {
        free(col);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < k; i++) {
        fill_normal(&rng, col, d, 1.0f);
        for (uint32_t p = 0; p < i; p++) { /* against each column before, twice (rounding) */
            for (int pass = 0; pass < 2; pass++) {
                double dot = 0;
                for (uint32_t r = 0; r < d; r++)
                    dot += (double)col[r] * m->basis[r * k + p];
                for (uint32_t r = 0; r < d; r++)
                    col[r] -= (float)dot * m->basis[r * k + p];
            }
        }
        double norm = 0;
        for (uint32_t r = 0; r < d; r++)
            norm += (double)col[r] * col[r];
        for (uint32_t r = 0; r < d; r++)
            m->basis[r * k + i] = (float)(col[r] / sqrt(norm));
    }
    free(col);
    return 0;
}

/* @t drawn in @m's subspace (none at full rank), reading or (@writes) writing the stream */
static struct synth_tensor *low_rank(const struct synth_model *m, struct synth_tensor *t,
                                     bool writes)
{
    if (m->basis) {
        t->basis = m->basis;
        t->rank = m->s->rank;
        t->writes = writes;
    }
    return t;
}

/* Layer @l's latent attention (model config @c of @m's shape): q through its bottleneck, the
 * latent and RoPE key (reading the stream), and ik_llama.cpp's attn_kv_b (transformers'
 * kv_b_proj) - of each head, the nope rows of W_UK then the value rows of W_UV, over the latent
 * (the importers split it: no kind of its own) */
static void mla_tensors(struct synth_model *m, const struct shlm_config *c, int l)
{
    const struct coord_synth_shape *s = m->s;
    uint64_t d = s->dim, q = (uint64_t)s->heads * s->head_dim, nope = s->head_dim - s->rope_dim;
    char name[64], hf[80];
    if (s->q_lora) {
        low_rank(m, add(m, c, SHLM_KIND_ATTN_Q_A, l, d, s->q_lora, 0, s->w_std, true), false);
        add_norm(m, c, SHLM_KIND_ATTN_Q_A_NORM, l, s->q_lora, 1.0f);
        add(m, c, SHLM_KIND_ATTN_Q_B, l, s->q_lora, q, 0, s->qk_std, true);
    } else {
        low_rank(m, add(m, c, SHLM_KIND_ATTN_Q, l, d, q, 0, s->qk_std, true), false);
    }
    low_rank(m, add(m, c, SHLM_KIND_ATTN_KV_A, l, d, s->kv_lora + s->rope_dim, 0, s->qk_std, true),
             false);
    add_norm(m, c, SHLM_KIND_ATTN_KV_A_NORM, l, s->kv_lora, 1.0f);
    snprintf(name, sizeof(name), "blk.%d.attn_kv_b.weight", l);
    snprintf(hf, sizeof(hf), "model.layers.%d.self_attn.kv_b_proj.weight", l);
    add_named(m, l, name, hf, s->kv_lora, (uint64_t)s->heads * (nope + s->v_dim), 0, s->qk_std,
              true);
}

/* The tensor list of shape @s in draw order, the basis drawn from @seed. Returns 0, -ENOMEM, or
 * -EINVAL for a shape fused where its architecture's row has no fused tensors (the caller frees
 * m->t and m->basis either way). */
static int model_init(struct synth_model *m, const struct coord_synth_shape *s, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    m->s = s;
    m->seed = seed;
    /* per layer: at most 20 tensors of a dense one, 18 + 6 per expert of a MoE one */
    m->cap = (20 + 6 * (size_t)s->experts) * s->layers + 8;
    m->t = calloc(m->cap, sizeof(*m->t));
    if (!m->t || (s->rank && make_basis(m)))
        return -ENOMEM;
    struct shlm_config cfg, *c = &cfg;
    shape_config(s, c);
    /* the first shapes (no Hugging Face form, full rank): std 0.02, norms 1.0, order as before */
    bool legacy = !s->hf_type && !s->rank;
    float w = legacy ? 0.02f : s->w_std, wqk = legacy ? 0.02f : s->qk_std;
    float emb = legacy ? 0.02f : s->emb_std, out_norm = s->out_norm ? s->out_norm : 1.0f;
    uint64_t d = s->dim, q = (uint64_t)s->heads * s->head_dim,
             kv = (uint64_t)s->kv_heads * s->head_dim;
    /* Gemma's post-norms set what each layer writes to the stream (its RMS), whatever the
     * weights: on the tiny shapes 1 / sqrt(layers), so that all layers' writes together are of
     * one write's size and the deep Gemma 2 shape is no more sensitive to rounding than the
     * 4-layer ones */
    float post = s->rank ? 1.0f / sqrtf((float)s->layers) : 1.0f;
    struct synth_tensor *t;
    rope_tables(m);
    low_rank(m, add(m, c, SHLM_KIND_TOK_EMBD, -1, d, s->vocab, 0, emb, true), false);
    add_norm(m, c, SHLM_KIND_OUTPUT_NORM, -1, d, out_norm);
    if (s->untied)
        low_rank(m, add(m, c, SHLM_KIND_OUTPUT, -1, d, s->vocab, 0, emb, true), false);
    if (s->rope == COORD_SYNTH_ROPE_LLAMA3)
        add(m, c, SHLM_KIND_ROPE_FREQS, -1, s->head_dim / 2, 0, 0, 0, false)->fixed = m->rope_long;
    if (s->rope == COORD_SYNTH_ROPE_LONGROPE) {
        add(m, c, SHLM_KIND_ROPE_FACTORS_LONG, -1, s->head_dim / 2, 0, 0, 0, false)->fixed =
            m->rope_long;
        add(m, c, SHLM_KIND_ROPE_FACTORS_SHORT, -1, s->head_dim / 2, 0, 0, 0, false)->fixed =
            m->rope_short;
    }
    for (int l = 0; l < (int)s->layers; l++) {
        add_norm(m, c, SHLM_KIND_ATTN_NORM, l, d, 1.0f);
        if (s->kv_lora) {
            mla_tensors(m, c, l);
        } else if (s->fused) { /* q, k, v rows stacked; its q and k parts drawn with the q/k std */
            if (!(t = add_fused(m, c, SHLM_KIND_ATTN_Q, l, d, wqk)))
                return -EINVAL;
            low_rank(m, t, false);
        } else {
            low_rank(m, add(m, c, SHLM_KIND_ATTN_Q, l, d, q, 0, wqk, true), false)->permute =
                s->llama_rope ? s->heads : 0;
            low_rank(m, add(m, c, SHLM_KIND_ATTN_K, l, d, kv, 0, wqk, true), false)->permute =
                s->llama_rope ? s->kv_heads : 0;
            low_rank(m, add(m, c, SHLM_KIND_ATTN_V, l, d, kv, 0, w, true), false);
        }
        if (s->bias_std > 0.0f) {
            add(m, c, SHLM_KIND_ATTN_Q_BIAS, l, q, 0, 0, s->bias_std, false);
            add(m, c, SHLM_KIND_ATTN_K_BIAS, l, kv, 0, 0, s->bias_std, false);
            add(m, c, SHLM_KIND_ATTN_V_BIAS, l, kv, 0, 0, s->bias_std, false);
        }
        if (s->head_gate)
            add(m, c, SHLM_KIND_ATTN_GATE, l, d, s->heads, 0, w, false);
        if (s->qk_norm) {
            add_norm(m, c, SHLM_KIND_ATTN_Q_NORM, l, s->head_dim, 1.0f);
            add_norm(m, c, SHLM_KIND_ATTN_K_NORM, l, s->head_dim, 1.0f);
        }
        uint64_t o_in = s->kv_lora ? (uint64_t)s->heads * s->v_dim : q;
        low_rank(m, add(m, c, SHLM_KIND_ATTN_O, l, o_in, d, 0, w, true), true);
        if (s->bias_std > 0.0f)
            add(m, c, SHLM_KIND_ATTN_O_BIAS, l, d, 0, 0, s->bias_std, false);
        if (s->sink_mean != 0.0f)
            add(m, c, SHLM_KIND_ATTN_SINKS, l, s->heads, 0, s->sink_mean, 1.0f, false);
        if (s->gemma)
            add_norm(m, c, SHLM_KIND_ATTN_POST_NORM, l, d, post);
        add_norm(m, c, SHLM_KIND_FFN_NORM, l, d, 1.0f);
        bool moe = s->experts && (uint32_t)l >= s->dense_first;
        if (moe) {
            float wr = s->router_std ? s->router_std : wqk;
            low_rank(m, add(m, c, SHLM_KIND_FFN_ROUTER, l, d, s->experts, 0, wr, false), false);
            if (s->bias_std > 0.0f)
                add(m, c, SHLM_KIND_FFN_ROUTER_BIAS, l, s->experts, 0, 0, wr, false);
            if (s->sel_std > 0.0f)
                add(m, c, SHLM_KIND_FFN_SEL_BIAS, l, s->experts, 0, 0, s->sel_std, false);
            if (s->shared) {
                uint64_t sh = (uint64_t)s->shared * s->expert_ffn;
                low_rank(m, add(m, c, SHLM_KIND_FFN_GATE_SHEXP, l, d, sh, 0, w, true), false);
                low_rank(m, add(m, c, SHLM_KIND_FFN_UP_SHEXP, l, d, sh, 0, w, true), false);
                low_rank(m, add(m, c, SHLM_KIND_FFN_DOWN_SHEXP, l, sh, d, 0, w, true), true);
            }
            /* each expert's gate, up and down (its matrices on MXFP4's grid where the shape's
             * are) */
            static const enum shlm_kind mats[] = {SHLM_KIND_FFN_GATE_EXP, SHLM_KIND_FFN_UP_EXP,
                                                  SHLM_KIND_FFN_DOWN_EXP};
            for (int k = 0; k < 3; k++)
                for (uint32_t x = 0; x < s->experts; x++) {
                    bool down = mats[k] == SHLM_KIND_FFN_DOWN_EXP;
                    t = add_expert(m, c, mats[k], l, x, down ? s->expert_ffn : d,
                                   down ? d : s->expert_ffn, 0, w, true);
                    low_rank(m, t, down)->mxfp4 = s->mxfp4;
                }
            if (s->bias_std > 0.0f) {
                static const enum shlm_kind bias[] = {SHLM_KIND_FFN_GATE_EXP_BIAS,
                                                      SHLM_KIND_FFN_UP_EXP_BIAS,
                                                      SHLM_KIND_FFN_DOWN_EXP_BIAS};
                for (int b = 0; b < 3; b++)
                    for (uint32_t x = 0; x < s->experts; x++)
                        add_expert(m, c, bias[b], l, x, b < 2 ? s->expert_ffn : d, 0, 0,
                                   s->bias_std, false);
            }
        } else if (s->fused) {
            if (!(t = add_fused(m, c, SHLM_KIND_FFN_UP, l, d, w)))
                return -EINVAL;
            low_rank(m, t, false);
        } else {
            low_rank(m, add(m, c, SHLM_KIND_FFN_GATE, l, d, s->ffn, 0, w, true), false);
            low_rank(m, add(m, c, SHLM_KIND_FFN_UP, l, d, s->ffn, 0, w, true), false);
        }
        if (!moe)
            low_rank(m, add(m, c, SHLM_KIND_FFN_DOWN, l, s->ffn, d, 0, w, true), true);
        if (s->gemma)
            add_norm(m, c, SHLM_KIND_FFN_POST_NORM, l, d, post);
    }
    return 0;
}

/* The architecture's key/values (general.*, <arch>.*), as llama.cpp's converter writes them. */
static void write_metadata(struct gguf_writer *w, const struct synth_model *m)
{
    const struct coord_synth_shape *s = m->s;
    char k[96];
#define KEY(suffix) (snprintf(k, sizeof(k), "%s." suffix, s->arch), k)
    gguf_w_str(w, "general.architecture", s->arch);
    /* ik_llama.cpp gives a model named "*phi3*" Phi-3's token attributes, which need its "</s>"
     * token (our vocabulary has none): "tiny-phi3" is named "tiny-phi 3" */
    char name[64];
    const char *phi = strstr(s->name, "phi3");
    if (phi)
        snprintf(name, sizeof(name), "%.*sphi 3%s", (int)(phi - s->name), s->name, phi + 4);
    gguf_w_str(w, "general.name", phi ? name : s->name);
    /* all F32, mostly F16, or (llama.cpp's 38) MXFP4 experts and the rest F16 */
    gguf_w_u32(w, "general.file_type", m->f32 ? 0 : s->mxfp4 ? 38 : 1);
    gguf_w_u32(w, KEY("context_length"), s->ctx);
    gguf_w_u32(w, KEY("embedding_length"), s->dim);
    gguf_w_u32(w, KEY("block_count"), s->layers);
    gguf_w_u32(w, KEY("feed_forward_length"), s->ffn);
    gguf_w_u32(w, KEY("attention.head_count"), s->heads);
    gguf_w_u32(w, KEY("attention.head_count_kv"), s->kv_heads);
    gguf_w_u32(w, KEY("attention.key_length"), s->head_dim);
    gguf_w_u32(w, KEY("attention.value_length"), s->kv_lora ? s->v_dim : s->head_dim);
    gguf_w_u32(w, KEY("rope.dimension_count"), s->kv_lora ? s->rope_dim : s->head_dim);
    gguf_w_f32(w, KEY("rope.freq_base"), s->theta);
    gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->eps ? s->eps : 1e-5f);
    gguf_w_u32(w, KEY("vocab_size"), s->vocab);
    if (s->window)
        gguf_w_u32(w, KEY("attention.sliding_window"), s->window);
    if (s->experts) {
        gguf_w_u32(w, KEY("expert_count"), s->experts);
        gguf_w_u32(w, KEY("expert_used_count"), s->experts_used);
        gguf_w_u32(w, KEY("expert_feed_forward_length"), s->expert_ffn);
    }
    if (s->attn_softcap)
        gguf_w_f32(w, KEY("attn_logit_softcapping"), s->attn_softcap);
    if (s->final_softcap)
        gguf_w_f32(w, KEY("final_logit_softcapping"), s->final_softcap);
    if (s->logit_scale) { /* Granite: ik requires all four */
        gguf_w_f32(w, KEY("logit_scale"), s->logit_scale);
        gguf_w_f32(w, KEY("residual_scale"), s->res_mult);
        gguf_w_f32(w, KEY("embedding_scale"), s->emb_mult);
        gguf_w_f32(w, KEY("attention.scale"), s->attn_mult);
    }
    if (s->rope == COORD_SYNTH_ROPE_YARN) { /* as llama.cpp's converter writes gpt-oss's */
        gguf_w_str(w, KEY("rope.scaling.type"), "yarn");
        gguf_w_f32(w, KEY("rope.scaling.factor"), (float)s->ctx / (float)s->rope_orig_ctx);
        gguf_w_u32(w, KEY("rope.scaling.original_context_length"), s->rope_orig_ctx);
        if (s->kv_lora) /* DeepSeek's: 0.1 mscale_all_dim */
            gguf_w_f32(w, KEY("rope.scaling.yarn_log_multiplier"), 0.1f);
    }
    if (s->kv_lora) { /* DeepSeek's, as llama.cpp's converter writes them */
        if (s->q_lora)
            gguf_w_u32(w, KEY("attention.q_lora_rank"), s->q_lora);
        gguf_w_u32(w, KEY("attention.kv_lora_rank"), s->kv_lora);
        gguf_w_u32(w, KEY("leading_dense_block_count"), s->dense_first);
        gguf_w_u32(w, KEY("expert_shared_count"), s->shared);
        gguf_w_f32(w, KEY("expert_weights_scale"), s->route_scale);
        gguf_w_bool(w, KEY("expert_weights_norm"), s->sigmoid);
        gguf_w_u32(w, KEY("expert_gating_func"), s->sigmoid ? 2 : 1); /* sigmoid, softmax */
    }
    if (s->rope == COORD_SYNTH_ROPE_LONGROPE) {
        double scale = (double)s->ctx / s->rope_orig_ctx;
        gguf_w_u32(w, KEY("rope.scaling.original_context_length"), s->rope_orig_ctx);
        gguf_w_f32(w, KEY("rope.scaling.attn_factor"),
                   (float)sqrt(1 + log(scale) / log((double)s->rope_orig_ctx)));
    }
#undef KEY
}

void synth_round_mxfp4(float *x, uint64_t n)
{
    uint8_t blk[17];
    for (uint64_t i = 0; i + 32 <= n; i += 32) {
        coord_rows_mxfp4_block(x + i, blk);
        coord_rows_to_f32(COORD_ROWS_MXFP4, blk, 32, x + i);
    }
}

/* Rows per synth_draw() call for tensor @t: a whole permuted tensor (its rows move), else about
 * 1 MiB - the same in both writers, so both draw the same values. */
uint64_t synth_block_rows(const struct synth_tensor *t)
{
    if (!t->rows)
        return 1;
    return t->permute || t->writes ? t->rows : (1u << 20) / t->cols + 1;
}

/* GGUF row order of HF row @r of a q/k tensor of @heads heads of @rows rows in all: each head's
 * first half goes to the even rows, its second half to the odd ones (llama.cpp's permute). */
static uint64_t gguf_row(uint64_t r, uint64_t rows, uint32_t heads)
{
    uint64_t hd = rows / heads, h = r / hd, i = r % hd;
    return h * hd + (i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1);
}

/* The tensor infos and data, reporting each layer to @progress. Returns 0 or -ENOMEM. */
static int write_tensors(struct gguf_writer *w, const struct synth_model *m,
                         void (*progress)(void *ctx, int done, int total), void *ctx)
{
    uint64_t rng = m->seed;
    size_t cap = 0;
    float *buf = NULL, *perm = NULL;
    for (size_t i = 0; i < m->n; i++) {
        const struct synth_tensor *t = &m->t[i];
        enum gguf_ggml_type type = !t->matrix || m->f32 ? GGML_F32
                                   : t->mxfp4           ? GGML_MXFP4
                                                        : GGML_F16;
        if (t->experts && t->expert) /* a layer's experts of a kind: one 3-D tensor */
            continue;
        if (t->experts && !t->rows) /* of vectors: one 2-D [cols][experts] */
            gguf_w_tensor(w, t->gguf, type, t->cols, t->experts);
        else
            gguf_w_tensor3(w, t->gguf, type, t->cols, t->rows, t->experts ? t->experts : 1);
        uint64_t b = synth_block_rows(t);
        if (b * t->cols > cap)
            cap = b * t->cols;
    }
    buf = malloc(cap * sizeof(float));
    perm = malloc(cap * sizeof(float));
    if (!buf || !perm)
        goto oom;
    for (size_t i = 0; i < m->n; i++) {
        const struct synth_tensor *t = &m->t[i];
        uint64_t rows = t->rows ? t->rows : 1, b = synth_block_rows(t);
        for (uint64_t r = 0; r < rows; r += b) {
            uint64_t n = rows - r < b ? rows - r : b;
            synth_draw(t, &rng, buf, n);
            if (t->mxfp4)
                synth_round_mxfp4(buf, n * t->cols);
            if (t->gguf_add != 0.0f)
                for (uint64_t j = 0; j < n * t->cols; j++)
                    buf[j] += t->gguf_add;
            if (t->permute) {
                for (uint64_t j = 0; j < n; j++)
                    memcpy(perm + gguf_row(j, n, t->permute) * t->cols, buf + j * t->cols,
                           t->cols * sizeof(float));
                gguf_w_tensor_rows(w, perm, n);
            } else
                gguf_w_tensor_rows(w, buf, n);
        }
        if (progress && t->layer >= 0 && (i + 1 == m->n || m->t[i + 1].layer != t->layer))
            progress(ctx, t->layer + 1, (int)m->s->layers);
    }
    free(buf);
    free(perm);
    return 0;
oom:
    free(buf);
    free(perm);
    return -ENOMEM;
}

static int write_gguf(const struct synth_model *m, const char *out,
                      void (*progress)(void *ctx, int done, int total), void *ctx,
                      struct shardlm_err *e)
{
    struct gguf_writer *w;
    int rc = gguf_writer_open(&w, out, e);
    if (rc)
        return rc;
    write_metadata(w, m);
    if ((rc = m->tok ? coord_synth_tok_gguf(w, m->tok) : write_vocab(w, m->s->vocab))) {
        shardlm_fail(e, rc, "out of memory");
        goto out_abort;
    }
    if (progress)
        progress(ctx, 0, (int)m->s->layers);
    if ((rc = write_tensors(w, m, progress, ctx))) {
        shardlm_fail(e, rc, "out of memory");
        goto out_abort;
    }
    return gguf_writer_close(w, e);
out_abort:
    gguf_writer_abort(w);
    return rc;
}

int coord_synth_write(const struct coord_synth_opts *o, struct shardlm_err *e)
{
    const struct coord_synth_shape *s = coord_synth_shape(o->shape);
    if (!s)
        return shardlm_fail(e, -EINVAL, "unknown shape '%s'", o->shape);
    if (o->hf && !s->hf_type)
        return shardlm_fail(e, -EINVAL, "shape '%s' has no Hugging Face form (--hf)", o->shape);
    if (s->rank % 2 || s->rank > 64 || s->rank > s->dim)
        return shardlm_fail(e, -EINVAL, "shape '%s': rank %u, expected even, at most 64 and %u",
                            o->shape, s->rank, s->dim);
    struct coord_synth_shape sized; /* a real tokenizer's vocabulary sizes the rows */
    if (o->tok) {
        sized = *s;
        sized.vocab = o->tok->vocab;
        s = &sized;
    }
    struct synth_model m;
    int rc = model_init(&m, s, o->seed ? o->seed : 0x9e3779b97f4a7c15ull);
    if (rc) {
        free(m.t);
        free(m.basis);
        return rc == -ENOMEM ? shardlm_fail(e, rc, "out of memory")
                             : shardlm_fail(e, rc,
                                            "shape %s: fused tensors, which architecture %s "
                                            "does not have",
                                            s->name, s->arch);
    }
    m.tok = o->tok;
    m.f32 = o->f32;
    rc = o->hf ? synth_write_hf(&m, o->out, o->progress, o->progress_ctx, e)
               : write_gguf(&m, o->out, o->progress, o->progress_ctx, e);
    free(m.t);
    free(m.basis);
    return rc;
}

int coord_synth(const char *shape, const char *out, uint64_t seed,
                void (*progress)(void *ctx, int done, int total), void *ctx, struct shardlm_err *e)
{
    struct coord_synth_opts o = {
        .shape = shape, .out = out, .seed = seed, .progress = progress, .progress_ctx = ctx};
    return coord_synth_write(&o, e);
}
