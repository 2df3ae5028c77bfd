/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_inspect.c: `shardlm inspect FILE` - architecture, config, scheme, tokenizer,
 * tensor table and sizes of a .shlm file or of any input `convert` reads, told apart by
 * coord_format_sniff(). */
#include "cli.h"

#include "gguf.h"
#include "llama2c.h"
#include "plan.h"
#include "sniff.h"
#include "source.h"
#include "tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void print_config(const struct shlm_config *c)
{
    printf("architecture: llama-family%s%s%s%s%s%s%s%s\n", c->qkv_bias ? " +qkv-bias" : "",
           c->head_gate ? " +head-gate" : "", c->embd_scale > 0 ? " +embedding-scale" : "",
           c->flags & SHLM_CF_QK_NORM ? " +qk-norm" : "",
           c->flags & SHLM_CF_POST_NORMS ? " +post-norms" : "",
           c->flags & SHLM_CF_ATTN_SINKS ? " +attention-sinks" : "",
           c->flags & SHLM_CF_O_BIAS ? " +output-bias" : "",
           c->flags & SHLM_CF_MOE_BIAS ? " +expert-biases" : "");
    printf("config: dim %u, hidden %u, layers %u, heads %u x %u, kv heads %u, vocab %u, "
           "context %u\n", c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->head_dim,
           c->n_kv_heads, c->vocab_size, c->seq_len);
    printf("        norm eps %g, rope theta %g (%s%s), activation %s, embeddings %s\n",
           (double)c->norm_eps, (double)c->rope_theta, c->rope_neox ? "neox" : "interleaved",
           c->rope_scaling == SHLM_ROPE_LLAMA3     ? ", llama3 scaling"
           : c->rope_scaling == SHLM_ROPE_YARN     ? ", yarn scaling"
           : c->rope_scaling == SHLM_ROPE_LONGROPE ? ", longrope scaling"
           : c->rope_scaling == SHLM_ROPE_FREQS    ? ", rope_freqs scaling"
           : c->rope_scaling == SHLM_ROPE_LINEAR   ? ", linear scaling"
                                                   : "",
           c->act == SHLM_ACT_GELU_TANH    ? "gelu-tanh gated"
           : c->act == SHLM_ACT_SWIGLU_OAI ? "clamped swiglu (gpt-oss)"
                                           : "silu gated",
           c->tied_embd ? "tied" : "untied");
}

/* Appends ", " (but first) and the formatted part to @line (@len bytes, *@n used). */
static void add_part(char *line, size_t len, int *n, const char *fmt, ...)
{
    va_list ap;
    if (*n > 0 && (size_t)*n < len)
        *n += snprintf(line + *n, len - (size_t)*n, ", ");
    va_start(ap, fmt);
    if ((size_t)*n < len)
        *n += vsnprintf(line + *n, len - (size_t)*n, fmt, ap);
    va_end(ap);
}

/* The extension's fields where any is set: the config's continuation line (Granite's residual
 * and logit multipliers, SmolLM3's layers without RoPE, YaRN's and LongRoPE's attention factor),
 * then the attention line (the window and the layers it applies to, their RoPE base, the score
 * scale and the soft-caps). */
static void print_ext(const struct shlm_config *c, const struct shlm_config_ext *x,
                      const struct shlm_header *h /* a .shlm file's or segment's; NULL */)
{
    char line[256] = "";
    int n = 0;
    if (x->resid_mult)
        add_part(line, sizeof(line), &n, "residual x%g", (double)x->resid_mult);
    if (x->logit_scale)
        add_part(line, sizeof(line), &n, "logits /%g", (double)x->logit_scale);
    if (x->nope_interval)
        add_part(line, sizeof(line), &n, "no RoPE on every %u-th layer", x->nope_interval);
    if (x->rope_attn_factor)
        add_part(line, sizeof(line), &n, "rope attention factor %g", (double)x->rope_attn_factor);
    if (x->yarn_exact)
        add_part(line, sizeof(line), &n, "yarn ramp unrounded");
    if (n)
        printf("        %s\n", line);
    n = 0;
    if (x->window) {
        uint32_t w = 0;
        for (uint32_t l = 0; l < c->n_layers; l++)
            w += shlm_layer_windowed(x, l);
        add_part(line, sizeof(line), &n, "window %u on %u of %u layers", x->window, w, c->n_layers);
        if (x->rope_theta_local > 0.0f)
            add_part(line, sizeof(line), &n, "their rope theta %g", (double)x->rope_theta_local);
    }
    if (x->query_scale > 0.0f)
        add_part(line, sizeof(line), &n, "score scale %g", (double)x->query_scale);
    if (x->attn_softcap > 0.0f)
        add_part(line, sizeof(line), &n, "score soft-cap %g", (double)x->attn_softcap);
    if (x->final_softcap > 0.0f)
        add_part(line, sizeof(line), &n, "logit soft-cap %g", (double)x->final_softcap);
    if (c->flags & SHLM_CF_ATTN_SINKS)
        add_part(line, sizeof(line), &n, "sinks");
    if (c->flags & SHLM_CF_O_BIAS)
        add_part(line, sizeof(line), &n, "output bias");
    if (n)
        printf("attention: %s\n", line);
    if (x->kv_lora_rank) {
        char q[48] = "q itself";
        if (x->q_lora_rank)
            snprintf(q, sizeof(q), "q through rank %u", x->q_lora_rank);
        printf("latent attention: %s, keys and values from a latent of rank %u, rope on %u of "
               "each head's %u, values of %u; cache %u floats a token and layer\n",
               q, x->kv_lora_rank, x->rope_dim, c->head_dim, shlm_v_dim(c, x), shlm_latent_dim(x));
    }
    if (x->n_experts) {
        uint32_t moe = 0;
        for (uint32_t l = 0; l < c->n_layers; l++)
            moe += shlm_layer_moe(x, l);
        bool sigmoid =
            x->moe_route == SHLM_ROUTE_SIGMOID || x->moe_route == SHLM_ROUTE_SIGMOID_NORM;
        bool norm =
            x->moe_route == SHLM_ROUTE_SOFTMAX_NORM || x->moe_route == SHLM_ROUTE_SIGMOID_NORM;
        char groups[64] = "", scale[32] = "", shared[48] = "";
        if (x->n_groups)
            snprintf(groups, sizeof(groups), " of the best %u of %u groups", x->topk_groups,
                     x->n_groups);
        if (x->route_scale != 0.0f)
            snprintf(scale, sizeof(scale), ", times %g", (double)x->route_scale);
        if (x->shared_ffn)
            snprintf(shared, sizeof(shared), ", shared experts of %u units", x->shared_ffn);
        printf("experts: %u in each of %u of %u layers, %u per token, %u units each%s%s; routing: "
               "%s%s, top k%s%s%s%s\n",
               x->n_experts, moe, c->n_layers, x->n_experts_used, x->expert_ffn,
               c->flags & SHLM_CF_MOE_BIAS ? " with biases" : "", shared,
               c->flags & SHLM_CF_MOE_BIAS ? "biased logits, " : "",
               sigmoid ? "sigmoid" : "softmax",
               c->flags & SHLM_CF_SEL_BIAS ? " (by score plus a selection bias)" : "", groups,
               norm ? ", weights renormalised" : "", scale);
        struct seg_plan p;
        if (!h || !h->shard_count || seg_plan_of(&p, h))
            printf("        placement: at load, tensor-parallel (every worker its share of every "
                   "expert's units) or with SHARDLM_EXPERTS=ep expert-parallel (each worker "
                   "whole experts)\n");
        else if (p.experts == SEG_EXPERTS_EP)
            printf("        placement: expert-parallel (this rank holds experts %d..%d whole)\n",
                   p.x0, p.x1 - 1);
        else
            printf("        placement: tensor-parallel (this rank holds units %d..%d of every "
                   "expert)\n",
                   p.e0, p.e1 - 1);
    }
}

static int inspect_shlm(const char *path, struct shardlm_err *e)
{
    void *map;
    size_t size;
    int rc = coord_map_nonempty(path, &map, &size, e);
    if (rc)
        return rc;
    struct shlm_model m;
    struct shardlm_err err;
    rc = shlm_parse(&m, map, size, path, &err);
    if (rc) {
        munmap(map, size);
        return shardlm_fail(e, rc, "%s", err.msg);
    }
    const struct shlm_header *h = m.hdr;
    printf("%s: .shlm version %u, %llu bytes%s\n", path, h->version,
           (unsigned long long)h->file_bytes, h->shard_count ? " (a weights segment)" : "");
    if (h->shard_count)
        printf("shard: rank %u of %u\n", h->shard_rank, h->shard_count);
    print_config(&h->cfg);
    print_ext(&h->cfg, &h->cfgx, h);
    printf("scheme: %s", shlm_scheme_name((enum shlm_scheme)h->scheme));
    if (h->group)
        printf(", group %u, embedding/head int%u", h->group, h->head_bits);
    printf("\ntokenizer: %s, %llu bytes, bos %u eos %u\n",
           h->tok_kind == SHLM_TOK_LLAMA2C ? "llama2.c tokenizer.bin" : "shardlm blob",
           (unsigned long long)h->tok_bytes, h->bos_id, h->eos_id);
    struct coord_tok tok;
    if (coord_tok_from_shlm(&tok, &m, path, &err) == 0) {
        if (tok.chat_template)
            printf("chat template: %zu bytes (`shardlm template` renders it)\n",
                   strlen(tok.chat_template));
        else
            printf("chat template: none (serve --chat-template FILE gives one)\n");
        coord_tok_free(&tok);
    }
    uint64_t total = 0, weights = 0;
    printf("tensors (%u):\n", h->n_tensors);
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const struct shlm_tensor *t = &m.tensors[i];
        printf("  %-24s %-5s %6u x %-6u %12llu bytes at %llu\n", t->name,
               kn_type_traits[t->dtype].name, t->rows, t->cols, (unsigned long long)t->bytes,
               (unsigned long long)t->offset);
        total += t->bytes;
        weights += (uint64_t)t->rows * t->cols;
    }
    printf("tensor bytes: %llu for %llu weights, %.3f bits per weight\n",
           (unsigned long long)total, (unsigned long long)weights,
           weights ? (double)total * 8.0 / (double)weights : 0.0);
    munmap(map, size);
    return 0;
}

static int inspect_gguf(const char *path, struct shardlm_err *e)
{
    struct gguf_file g;
    int rc = gguf_open(&g, path, e);
    if (rc)
        return rc;
    printf("%s: GGUF version %u, %llu metadata keys, %llu tensors, %zu bytes\n", path, g.version,
           (unsigned long long)g.n_kv, (unsigned long long)g.n_tensors, g.size);
    /* keys, values and names are the file's: escaped (coord_escape()), values cut at 80 bytes */
    char k[400], v[400];
    for (uint64_t i = 0; i < g.n_kv; i++) {
        const struct gguf_kv *kv = &g.kv[i];
        printf("  %s = ", coord_escape(k, sizeof(k), kv->key.p, kv->key.len));
        switch (kv->type) {
        case GGUF_STRING:
            printf("\"%s\"%s\n",
                   coord_escape(v, sizeof(v), kv->v.s.p, kv->v.s.len > 80 ? 80 : kv->v.s.len),
                   kv->v.s.len > 80 ? "..." : "");
            break;
        case GGUF_ARRAY:
            printf("[%llu elements]\n", (unsigned long long)kv->v.arr.n);
            break;
        case GGUF_FLOAT32:
        case GGUF_FLOAT64:
            printf("%g\n", kv->v.f);
            break;
        case GGUF_INT8:
        case GGUF_INT16:
        case GGUF_INT32:
        case GGUF_INT64:
            printf("%lld\n", (long long)kv->v.i);
            break;
        default:
            printf("%llu\n", (unsigned long long)kv->v.u);
        }
    }
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const struct gguf_tensor *t = &g.tensors[i];
        printf("  %-28s type %-2d dims", coord_escape(k, sizeof(k), t->name.p, t->name.len),
               (int)t->type);
        for (uint32_t d = 0; d < t->n_dims; d++)
            printf(" %llu", (unsigned long long)t->dims[d]);
        printf("\n");
    }
    gguf_close(&g);
    return 0;
}

static int inspect_llama2c(const char *path, struct shardlm_err *e)
{
    struct coord_llama2c ck;
    int rc = coord_llama2c_open(&ck, path, e);
    if (rc)
        return rc;
    printf("%s: llama2.c checkpoint, %zu bytes\n", path, ck.map_bytes);
    print_config(&ck.cfg);
    coord_llama2c_close(&ck);
    return 0;
}

/* A Hugging Face folder, opened as `convert` opens it. */
static int inspect_hf(const char *path, struct shardlm_err *e)
{
    struct coord_source s;
    int rc = coord_source_open(&s, path, NULL, 0, e);
    if (rc)
        return rc;
    printf("%s:\n", path);
    print_config(&s.cfg);
    print_ext(&s.cfg, &s.cfgx, NULL);
    printf("tokenizer: %zu bytes, bos %u eos %u\n", s.tok_len, s.bos_id, s.eos_id);
    coord_source_close(&s);
    return 0;
}

int coord_cmd_inspect(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: shardlm inspect FILE\n"
               "\n"
               "Prints the architecture, config, scheme, tokenizer and tensor table of a .shlm\n"
               "file, a GGUF file, a Hugging Face directory or a llama2.c checkpoint.\n");
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: shardlm inspect FILE\n");
        return 2;
    }
    const char *path = argv[1];
    if (!*path)
        return coord_cli_empty_path("inspect", "usage: shardlm inspect FILE\n", "FILE");
    struct shardlm_err e;
    enum coord_format fmt;
    int rc = coord_format_sniff(path, &fmt, &e);
    if (!rc) {
        switch (fmt) {
        case COORD_FORMAT_SHLM:
            rc = inspect_shlm(path, &e);
            break;
        case COORD_FORMAT_GGUF:
            rc = inspect_gguf(path, &e);
            break;
        case COORD_FORMAT_HF_DIR:
            rc = inspect_hf(path, &e);
            break;
        default: /* no magic: a llama2.c checkpoint, or no model (its reader says which) */
            rc = inspect_llama2c(path, &e);
        }
    }
    if (rc) {
        fprintf(stderr, "shardlm inspect: %s\n", e.msg);
        return 1;
    }
    return 0;
}
