/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth_hf.c: a synthetic model as a Hugging Face folder - config.json with
 * the architecture's own fields, model.safetensors (HF names and layouts: q/k rows in HF's
 * rotate-half order, Gemma norms as w where the GGUF holds 1 + w), tokenizer.json (byte-level
 * BPE) and tokenizer_config.json - holding the model of the GGUF synth.c writes for the same
 * shape and seed. */
#include "synth_internal.h"
#include "synth_tok.h"

#include "kn.h"
#include "rows.h"
#include "tensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int synth_write_text(const char *dir, const char *name, const char *text, size_t len,
                     struct shardlm_err *e)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = coord_out_open(path, tmp, sizeof(tmp), e);
    if (fd < 0)
        return fd;
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, text + done, len - done);
        if (n < 0) {
            int err = -errno;
            close(fd);
            unlink(tmp);
            return shardlm_fail(e, err, "%s: %s", tmp, strerror(-err));
        }
        done += (size_t)n;
    }
    int err = fsync(fd) < 0 ? -errno : 0; /* (closed either way) */
    if (close(fd) < 0 && !err)
        err = -errno;
    if (err) {
        unlink(tmp);
        return shardlm_fail(e, err, "%s: %s", tmp, strerror(-err));
    }
    return coord_out_commit(tmp, path, e);
}

/* Writes JSON @j (taking it) to @dir/@name, indented. Returns 0 or -errno. */
static int write_json(const char *dir, const char *name, json_t *j, struct shardlm_err *e)
{
    char *text =
        j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!text)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    size_t len = strlen(text);
    char *nl = realloc(text, len + 2);
    if (!nl) {
        free(text);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    nl[len++] = '\n';
    int rc = synth_write_text(dir, name, nl, len, e);
    free(nl);
    return rc;
}

/* @f as the shortest decimal that reads back as @f (config.json says 1e-05, not 9.99999975e-06). */
static json_t *real(float f)
{
    char txt[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(txt, sizeof(txt), "%.*g", prec, (double)f);
        if ((float)strtod(txt, NULL) == f)
            break;
    }
    return json_real(strtod(txt, NULL));
}

static json_t *floats(const float *v, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < n; i++)
        json_array_append_new(a, real(v[i]));
    return a;
}

/* config.json: the fields transformers' config class of the model type reads. */
static json_t *config(const struct synth_model *m)
{
    const struct coord_synth_shape *s = m->s;
    const char *type = s->hf_type;
    json_t *c = json_object(), *layer_types = NULL;
    json_object_set_new(c, "architectures", json_pack("[s]", s->hf_class));
    json_object_set_new(c, "model_type", json_string(type));
    json_object_set_new(c, "hidden_size", json_integer(s->dim));
    json_object_set_new(c, "intermediate_size", json_integer(s->ffn));
    json_object_set_new(c, "num_hidden_layers", json_integer(s->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(s->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(s->kv_heads));
    if (s->kv_lora) /* transformers' DeepseekV3Config: the RoPE part */
        json_object_set_new(c, "head_dim", json_integer(s->rope_dim));
    else if (!s->fused) /* Phi-3 has none: head_dim = hidden_size / heads */
        json_object_set_new(c, "head_dim", json_integer(s->head_dim));
    json_object_set_new(c, "max_position_embeddings", json_integer(s->ctx));
    json_object_set_new(c, "rms_norm_eps", real(s->eps));
    json_object_set_new(c, "rope_theta", real(s->theta));
    json_object_set_new(c, "vocab_size", json_integer(s->vocab));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(!s->untied));
    int bos = m->tok ? m->tok->bos : (int)s->vocab - 2,
        eos = m->tok ? m->tok->eos : (int)s->vocab - 1;
    json_object_set_new(c, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
    json_object_set_new(c, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
    json_object_set_new(c, s->gemma ? "hidden_activation" : "hidden_act",
                        json_string(s->gelu ? "gelu_pytorch_tanh" : "silu"));
    json_object_set_new(c, "attention_bias", json_boolean(s->bias_std > 0.0f));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "torch_dtype", json_string(m->f32 ? "float32" : "float16"));
    if (s->window_pattern) { /* Gemma: which layers slide, as transformers names them */
        layer_types = json_array();
        for (uint32_t l = 0; l < s->layers; l++) {
            bool local = s->window_pattern == 2 ? l % 2 == 0 : (l + 1) % s->window_pattern != 0;
            json_array_append_new(layer_types,
                                  json_string(local ? "sliding_attention" : "full_attention"));
        }
    }
    if (!strcmp(type, "gpt_oss")) { /* as gpt-oss's config.json */
        json_object_set_new(c, "sliding_window", json_integer(s->window));
        json_object_set_new(c, "layer_types", layer_types);
        json_object_set_new(c, "num_local_experts", json_integer(s->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(s->experts_used));
        json_object_set_new(c, "experts_per_token", json_integer(s->experts_used));
        json_object_set_new(c, "intermediate_size", json_integer(s->expert_ffn));
        json_object_set_new(c, "swiglu_limit", json_real(7.0));
        /* truncate true: ik_llama.cpp's (ggml's) rounded ramp, which the references have;
         * gpt-oss's own config says false (yarn_exact) */
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i, s:b}", "rope_type", "yarn",
                                      "factor", (double)s->ctx / s->rope_orig_ctx, "beta_fast",
                                      32.0, "beta_slow", 1.0, "original_max_position_embeddings",
                                      (int)s->rope_orig_ctx, "truncate", 1));
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:s, s:[s, s, s, s]}", "quant_method", "mxfp4",
                                      "modules_to_not_convert", "model.layers.*.self_attn",
                                      "model.layers.*.mlp.router", "model.embed_tokens",
                                      "lm_head"));
    } else if (s->gemma) {
        json_object_set_new(c, "query_pre_attn_scalar", real(s->query_scalar));
        json_object_set_new(c, "sliding_window", json_integer(s->window));
        json_object_set_new(c, "attn_logit_softcapping",
                            s->attn_softcap ? real(s->attn_softcap) : json_null());
        json_object_set_new(c, "final_logit_softcapping",
                            s->final_softcap ? real(s->final_softcap) : json_null());
        json_object_set_new(c, "layer_types", layer_types);
        if (s->window_pattern == 6) {
            json_object_set_new(c, "sliding_window_pattern", json_integer(6));
            json_object_set_new(c, "rope_local_base_freq", real(s->theta_local));
            json_object_set_new(c, "rope_scaling", json_null());
        }
    } else {
        json_decref(layer_types);
        json_object_set_new(c, "sliding_window", s->window ? json_integer(s->window) : json_null());
    }
    if (!strcmp(type, "qwen3") || !strcmp(type, "smollm3") || !strcmp(type, "qwen3_moe"))
        json_object_set_new(c, "use_sliding_window", json_false());
    if (s->kv_lora) { /* as DeepSeek-V3's config.json */
        json_object_set_new(c, "q_lora_rank", s->q_lora ? json_integer(s->q_lora) : json_null());
        json_object_set_new(c, "kv_lora_rank", json_integer(s->kv_lora));
        json_object_set_new(c, "qk_nope_head_dim", json_integer(s->head_dim - s->rope_dim));
        json_object_set_new(c, "qk_rope_head_dim", json_integer(s->rope_dim));
        json_object_set_new(c, "v_head_dim", json_integer(s->v_dim));
        json_object_set_new(c, "n_routed_experts", json_integer(s->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(s->experts_used));
        json_object_set_new(c, "moe_intermediate_size", json_integer(s->expert_ffn));
        json_object_set_new(c, "n_shared_experts", json_integer(s->shared));
        json_object_set_new(c, "first_k_dense_replace", json_integer(s->dense_first));
        json_object_set_new(c, "moe_layer_freq", json_integer(1));
        json_object_set_new(c, "routed_scaling_factor", real(s->route_scale));
        json_object_set_new(c, "norm_topk_prob", json_boolean(s->sigmoid));
        json_object_set_new(c, "scoring_func", json_string(s->sigmoid ? "sigmoid" : "softmax"));
        json_object_set_new(c, "topk_method", json_string(s->sigmoid ? "noaux_tc" : "greedy"));
        json_object_set_new(c, "n_group", json_integer(1));
        json_object_set_new(c, "topk_group", json_integer(1));
        json_object_set_new(c, "rope_interleave", json_true());
        /* mscale_all_dim 1: GGUF's yarn_log_multiplier 0.1 */
        json_object_set_new(
            c, "rope_scaling",
            s->rope != COORD_SYNTH_ROPE_YARN
                ? json_null()
                : json_pack("{s:s, s:f, s:f, s:f, s:i, s:f, s:f}", "type", "yarn", "factor",
                            (double)s->ctx / s->rope_orig_ctx, "beta_fast", 32.0, "beta_slow", 1.0,
                            "original_max_position_embeddings", (int)s->rope_orig_ctx, "mscale",
                            1.0, "mscale_all_dim", 1.0));
    } else if (s->experts && !strcmp(type, "gpt_oss")) { /* above */
    } else if (s->experts && !strcmp(type, "mixtral")) { /* intermediate_size is an expert's */
        json_object_set_new(c, "num_local_experts", json_integer(s->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(s->experts_used));
        json_object_set_new(c, "intermediate_size", json_integer(s->expert_ffn));
    } else if (s->experts) { /* Qwen3-MoE: every layer sparse */
        json_object_set_new(c, "num_experts", json_integer(s->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(s->experts_used));
        json_object_set_new(c, "moe_intermediate_size", json_integer(s->expert_ffn));
        json_object_set_new(c, "norm_topk_prob", json_true());
        json_object_set_new(c, "decoder_sparse_step", json_integer(1));
        json_object_set_new(c, "mlp_only_layers", json_array());
    }
    if (!strcmp(type, "llama") || !strcmp(type, "granite") || !strcmp(type, "smollm3"))
        json_object_set_new(c, "mlp_bias", json_false());
    if (s->logit_scale) {
        json_object_set_new(c, "embedding_multiplier", real(s->emb_mult));
        json_object_set_new(c, "residual_multiplier", real(s->res_mult));
        json_object_set_new(c, "attention_multiplier", real(s->attn_mult));
        json_object_set_new(c, "logits_scaling", real(s->logit_scale));
    }
    if (s->no_rope_every) {
        json_t *a = json_array();
        for (uint32_t l = 0; l < s->layers; l++) /* 1: this layer uses RoPE */
            json_array_append_new(a, json_integer((l + 1) % s->no_rope_every != 0));
        json_object_set_new(c, "no_rope_layers", a);
        json_object_set_new(c, "no_rope_layer_interval", json_integer(s->no_rope_every));
    }
    uint32_t half = s->head_dim / 2;
    if (s->rope == COORD_SYNTH_ROPE_LLAMA3) {
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      (double)s->rope_factor, "low_freq_factor",
                                      (double)s->rope_low, "high_freq_factor", (double)s->rope_high,
                                      "original_max_position_embeddings", (int)s->rope_orig_ctx));
        /* llama.cpp's converter reads it at the top level (default 8192) */
        json_object_set_new(c, "original_max_position_embeddings", json_integer(s->rope_orig_ctx));
    }
    if (s->rope == COORD_SYNTH_ROPE_LONGROPE) {
        json_t *r = json_object();
        json_object_set_new(r, "type", json_string("longrope"));
        json_object_set_new(r, "long_factor", floats(m->rope_long, half));
        json_object_set_new(r, "short_factor", floats(m->rope_short, half));
        json_object_set_new(c, "rope_scaling", r);
        json_object_set_new(c, "original_max_position_embeddings", json_integer(s->rope_orig_ctx));
        json_object_set_new(c, "partial_rotary_factor", json_real(1.0));
    }
    return c;
}

/* tokenizer.json: byte-level BPE over synth_vocab, BOS added by the post-processor. */
static json_t *tokenizer(const struct synth_vocab *v)
{
    json_t *t = json_object(), *added = json_array(), *vocab = json_object(),
           *merges = json_array();
    for (uint32_t id = v->bos; id <= v->eos; id++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)id,
                                               "content", v->tok[id], "single_word", 0, "lstrip", 0,
                                               "rstrip", 0, "normalized", 0, "special", 1));
    for (uint32_t id = 0; id < v->n; id++)
        json_object_set_new(vocab, v->tok[id], json_integer(id));
    for (uint32_t k = 0; k < v->n_merges; k++)
        json_array_append_new(merges, json_string(v->merges[k]));
    const char *bos = v->tok[v->bos];
    json_object_set_new(t, "version", json_string("1.0"));
    json_object_set_new(t, "truncation", json_null());
    json_object_set_new(t, "padding", json_null());
    json_object_set_new(t, "added_tokens", added);
    json_object_set_new(t, "normalizer", json_null());
    json_object_set_new(t, "pre_tokenizer",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                                  0, "trim_offsets", 1, "use_regex", 1));
    json_object_set_new(
        t, "post_processor",
        json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, "
                  "{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
                  "type", "TemplateProcessing", "single", "SpecialToken", "id", bos, "type_id", 0,
                  "Sequence", "id", "A", "type_id", 0, "pair", "SpecialToken", "id", bos, "type_id",
                  0, "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", bos, "type_id", 1,
                  "Sequence", "id", "B", "type_id", 1, "special_tokens", bos, "id", bos, "ids",
                  (int)v->bos, "tokens", bos));
    json_object_set_new(t, "decoder",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                                  0, "trim_offsets", 1, "use_regex", 1));
    json_object_set_new(t, "model",
                        json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type",
                                  "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                                  "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
                                  "ignore_merges", 0, "vocab", vocab, "merges", merges));
    return t;
}

static json_t *tokenizer_config(const struct synth_model *m, const struct synth_vocab *v)
{
    return json_pack("{s:b, s:b, s:s, s:s, s:s, s:i, s:s, s:b}", "add_bos_token", 1,
                     "add_eos_token", 0, "bos_token", v->tok[v->bos], "eos_token", v->tok[v->eos],
                     "chat_template", COORD_SYNTH_CHAT_TEMPLATE, "model_max_length", (int)m->s->ctx,
                     "tokenizer_class", "PreTrainedTokenizerFast", "clean_up_tokenization_spaces",
                     0);
}

/* model.safetensors: the header (tensors in draw order, contiguous), then the data. */
/* gpt-oss's experts as its checkpoints hold them (source_hf.c's gptoss_read): each layer's gate
 * and up of every expert in one tensor, their rows interleaved, and down, as MXFP4 blocks in the
 * checkpoint's nibble order with their scales, and the biases likewise. Gathered in memory while
 * the list is drawn (a layer's experts' kinds come one after the other), written after the other
 * tensors. */
struct gather {
    bool on;
    uint32_t ne, units, dim, layers;
    float *gu, *dn, *gub, *dnb; /* per layer [ne][2 units][dim], [ne][dim][units], [ne][2 units],
                                 * [ne][dim] */
};

static int gather_init(struct gather *g, const struct synth_model *m)
{
    const struct coord_synth_shape *s = m->s;
    const struct shlm_arch_traits *a = s->hf_class ? shlm_arch_hf(s->hf_class) : NULL;
    memset(g, 0, sizeof(*g));
    if (!a || a->hf_moe != SHLM_HF_MOE_GPTOSS || !s->experts)
        return 0;
    g->on = true;
    g->ne = s->experts;
    g->units = s->expert_ffn;
    g->dim = s->dim;
    g->layers = s->layers;
    size_t l = g->layers, e = g->ne, u = g->units, d = g->dim;
    g->gu = calloc(l * e * 2 * u * d, sizeof(float));
    g->dn = calloc(l * e * d * u, sizeof(float));
    g->gub = calloc(l * e * 2 * u, sizeof(float));
    g->dnb = calloc(l * e * d, sizeof(float));
    return g->gu && g->dn && g->gub && g->dnb ? 0 : -ENOMEM;
}

static void gather_free(struct gather *g)
{
    free(g->gu);
    free(g->dn);
    free(g->gub);
    free(g->dnb);
}

/* Whether @t is one of the gathered tensors */
static bool gathered(const struct gather *g, const struct synth_tensor *t)
{
    return g->on && t->experts && t->hf[0];
}

/* Rows [r0, r0 + n) of @t's values @v into @g's buffers. */
static void gather_put(struct gather *g, const struct synth_tensor *t, uint64_t r0, uint64_t n,
                       const float *v)
{
    size_t e = g->ne, u = g->units, d = g->dim, l = (size_t)t->layer, x = t->expert;
    bool up = t->kind == SHLM_KIND_FFN_UP_EXP || t->kind == SHLM_KIND_FFN_UP_EXP_BIAS;
    switch ((enum shlm_kind)t->kind) {
    case SHLM_KIND_FFN_GATE_EXP:
    case SHLM_KIND_FFN_UP_EXP:
        for (uint64_t r = 0; r < n; r++)
            memcpy(g->gu + ((l * e + x) * 2 * u + 2 * (r0 + r) + up) * d, v + r * d,
                   d * sizeof(float));
        return;
    case SHLM_KIND_FFN_DOWN_EXP:
        memcpy(g->dn + ((l * e + x) * d + r0) * u, v, n * u * sizeof(float));
        return;
    case SHLM_KIND_FFN_GATE_EXP_BIAS:
    case SHLM_KIND_FFN_UP_EXP_BIAS:
        for (size_t i = 0; i < u; i++)
            g->gub[(l * e + x) * 2 * u + 2 * i + up] = v[i];
        return;
    case SHLM_KIND_FFN_DOWN_EXP_BIAS:
        memcpy(g->dnb + (l * e + x) * d, v, d * sizeof(float));
        return;
    default:
        KN_ASSERT(!"a gathered tensor of another kind");
    }
}

/* The shape of layer @l's gathered @part (0 gate_up, 1 down): its rows (per expert) and
 * columns. */
static void gather_shape(const struct gather *g, int part, size_t *rows, size_t *cols)
{
    *rows = part ? g->dim : 2 * g->units;
    *cols = part ? g->units : g->dim;
}

/* One gathered output, layer @l's @part @what (0 blocks, 1 scales, 2 bias): its name, dtype and
 * shape into @h at *@off (advanced). */
static void gather_head(const struct gather *g, uint32_t l, int part, int what, json_t *h,
                        uint64_t *off)
{
    size_t e = g->ne, rows, cols;
    gather_shape(g, part, &rows, &cols);
    size_t nb = cols / 32;
    static const char *const whats[] = {"blocks", "scales", "bias"};
    char name[160];
    snprintf(name, sizeof(name), "model.layers.%u.mlp.experts.%s_%s", l,
             part ? "down_proj" : "gate_up_proj", whats[what]);
    uint64_t bytes = what == 0 ? e * rows * nb * 16 : what == 1 ? e * rows * nb : e * rows * 4;
    json_t *shape = what == 0 ? json_pack("[I, I, I, I]", (json_int_t)e, (json_int_t)rows,
                                          (json_int_t)nb, (json_int_t)16)
                    : what == 1
                        ? json_pack("[I, I, I]", (json_int_t)e, (json_int_t)rows, (json_int_t)nb)
                        : json_pack("[I, I]", (json_int_t)e, (json_int_t)rows);
    json_object_set_new(h, name,
                        json_pack("{s:s, s:o, s:[I, I]}", "dtype", what == 2 ? "F32" : "U8",
                                  "shape", shape, "data_offsets", (json_int_t)*off,
                                  (json_int_t)(*off + bytes)));
    *off += bytes;
}

/* And its bytes, into @f: the blocks in the checkpoint's nibble order (ggml's codes re-packed two
 * per byte in element order), the E8M0 scales (ggml's byte is the checkpoint's), the biases. */
static void gather_data(const struct gather *g, uint32_t l, int part, int what, FILE *f)
{
    size_t e = g->ne, rows, cols;
    gather_shape(g, part, &rows, &cols);
    size_t nb = cols / 32;
    if (what == 2) {
        fwrite(part ? g->dnb + (size_t)l * e * g->dim : g->gub + (size_t)l * e * 2 * g->units, 4,
               e * rows, f);
        return;
    }
    const float *v = (part ? g->dn : g->gu) + (size_t)l * e * rows * cols;
    for (size_t r = 0; r < e * rows; r++)
        for (size_t k = 0; k < nb; k++) {
            uint8_t blk[17], out[16], code[32];
            coord_rows_mxfp4_block(v + r * cols + k * 32, blk);
            for (int j = 0; j < 16; j++) {
                code[j] = blk[1 + j] & 15;
                code[j + 16] = blk[1 + j] >> 4;
            }
            for (int j = 0; j < 16; j++)
                out[j] = (uint8_t)(code[2 * j] | code[2 * j + 1] << 4);
            if (what == 0)
                fwrite(out, 1, 16, f);
            else
                fwrite(blk, 1, 1, f);
        }
}

static int write_safetensors(const struct synth_model *m, const char *dir,
                             void (*progress)(void *ctx, int done, int total), void *ctx,
                             struct shardlm_err *e)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    json_t *h = json_object();
    uint64_t off = 0, cap = 0;
    struct gather g;
    if (gather_init(&g, m)) {
        gather_free(&g);
        json_decref(h);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < m->n; i++) {
        const struct synth_tensor *t = &m->t[i];
        uint64_t b = synth_block_rows(t) * t->cols;
        cap = b > cap ? b : cap;
        if (!t->hf[0] || gathered(&g, t))
            continue;
        bool f16 = t->matrix && !m->f32;
        uint64_t bytes = (t->rows ? t->rows : 1) * t->cols * (f16 ? 2 : 4);
        json_t *shape = t->rows ? json_pack("[I, I]", (json_int_t)t->rows, (json_int_t)t->cols)
                                : json_pack("[I]", (json_int_t)t->cols);
        json_object_set_new(h, t->hf,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", f16 ? "F16" : "F32", "shape",
                                      shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + bytes)));
        off += bytes;
    }
    for (uint32_t l = 0; g.on && l < g.layers; l++)
        for (int part = 0; part < 2; part++)
            for (int what = 0; what < 3; what++)
                gather_head(&g, l, part, what, h, &off);
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *head = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t hlen = head ? strlen(head) : 0, padded = (hlen + 8 + 7) / 8 * 8 - 8;
    float *buf = malloc(cap * sizeof(float));
    uint16_t *out = malloc(cap * sizeof(uint16_t)); /* F16 */
    int rc = 0, fd = -1;
    FILE *f = NULL;
    if (!head || !buf || !out) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out_free;
    }
    if ((fd = coord_out_open(path, tmp, sizeof(tmp), e)) < 0) {
        rc = fd;
        goto out_free;
    }
    if (!(f = fdopen(fd, "wb"))) {
        close(fd);
        unlink(tmp);
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out_free;
    }
    uint64_t n8 = padded;
    fwrite(&n8, 8, 1, f); /* little-endian hosts only, as the reader */
    fwrite(head, 1, hlen, f);
    for (size_t i = hlen; i < padded; i++)
        fputc(' ', f);
    uint64_t rng = m->seed;
    for (size_t i = 0; i < m->n; i++) {
        const struct synth_tensor *t = &m->t[i];
        uint64_t rows = t->rows ? t->rows : 1, b = synth_block_rows(t);
        for (uint64_t r = 0; r < rows; r += b) {
            uint64_t n = rows - r < b ? rows - r : b;
            synth_draw(t, &rng, buf, n); /* every tensor draws, HF-only or not */
            if (!t->hf[0])
                continue;
            if (gathered(&g, t)) {
                gather_put(&g, t, r, n, buf);
                continue;
            }
            size_t cnt = n * t->cols;
            if (t->matrix && !m->f32) {
                for (size_t j = 0; j < cnt; j++)
                    out[j] = kn_f32_to_f16(buf[j]);
                fwrite(out, 2, cnt, f);
            } else
                fwrite(buf, 4, cnt, f);
        }
        if (progress && t->layer >= 0 && (i + 1 == m->n || m->t[i + 1].layer != t->layer))
            progress(ctx, t->layer + 1, (int)m->s->layers);
    }
    for (uint32_t l = 0; g.on && l < g.layers; l++)
        for (int part = 0; part < 2; part++)
            for (int what = 0; what < 3; what++)
                gather_data(&g, l, part, what, f);
    if (fflush(f) || ferror(f) || fsync(fileno(f)) < 0) {
        rc = shardlm_fail(e, -EIO, "%s: write failed: %s", tmp, strerror(errno));
        fclose(f);
        unlink(tmp);
        goto out_free;
    }
    if (fclose(f)) {
        rc = shardlm_fail(e, -EIO, "%s: write failed: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out_free;
    }
    rc = coord_out_commit(tmp, path, e);
out_free:
    gather_free(&g);
    free(head);
    free(buf);
    free(out);
    return rc;
}

int synth_write_hf(const struct synth_model *m, const char *dir,
                   void (*progress)(void *ctx, int done, int total), void *ctx,
                   struct shardlm_err *e)
{
    /* every file it writes checked first: one that cannot be replaced (a FIFO, a device, a
     * folder, a symbolic link) fails before any is written */
    static const char *const outputs[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                          "model.safetensors"};
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return shardlm_fail(e, -errno, "%s: %s", dir, strerror(errno));
    int rc = coord_check_folder(dir, e);
    for (size_t i = 0; !rc && i < sizeof(outputs) / sizeof(outputs[0]); i++) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, outputs[i]);
        rc = coord_out_check(path, NULL, 0, e);
    }
    if (rc)
        return rc;
    rc = write_json(dir, "config.json", config(m), e);
    if (m->tok) { /* a real tokenizer's files, as they are */
        rc = rc ? rc : coord_synth_tok_hf(m->tok, dir, e);
    } else {
        struct synth_vocab v;
        if (synth_vocab_init(&v, m->s->vocab))
            return shardlm_fail(e, -ENOMEM, "out of memory");
        rc = rc ? rc : write_json(dir, "tokenizer.json", tokenizer(&v), e);
        rc = rc ? rc : write_json(dir, "tokenizer_config.json", tokenizer_config(m, &v), e);
        synth_vocab_free(&v);
    }
    if (!rc && progress)
        progress(ctx, 0, (int)m->s->layers);
    return rc ? rc : write_safetensors(m, dir, progress, ctx, e);
}
