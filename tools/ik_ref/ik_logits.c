/* SPDX-License-Identifier: MIT */
/* tools/ik_ref/ik_logits.c: reference logits from ik_llama.cpp for tests/data/golden (built by
 * build.sh against an ik_llama.cpp tree; not part of shardlm's build). Loads a GGUF on the CPU,
 * feeds the given token ids as one batch, then decodes greedily one token at a time until
 * TOTAL ids have been fed, and writes every position's logits (float32, or float16 when OUT
 * ends in .f16), a row of the vocabulary per id fed. An F32 GGUF is evaluated in f32 but for the
 * V cache, which ik keeps in F16 (it takes an F32 one only with flash attention, whose CPU
 * kernels take no F32 K/V): on tiny-mistral, shardlm's f32 forward is within kld 1.9e-6 and a
 * relative L2 of 6e-4 (float16 files included) of these logits.
 *
 *   ik_logits MODEL.gguf OUT THREADS TOTAL ID...
 *
 * stdout: the TOTAL ids fed, space-separated; stderr: the mean top-1 probability. */
#include "ggml.h"
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level >= GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* The softmax probability of the largest logit of @x (@n) and its index. */
static double top1(const float *x, int n, int *arg)
{
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a])
            a = i;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)x[i] - x[a]);
    *arg = a;
    return 1.0 / sum;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: ik_logits MODEL.gguf OUT THREADS TOTAL ID...\n");
        return 2;
    }
    const char *out = argv[2];
    int threads = atoi(argv[3]), total = atoi(argv[4]), n_given = argc - 5;
    if (total < n_given || total <= 0) {
        fprintf(stderr, "ik_logits: TOTAL %d is less than the %d ids given\n", total, n_given);
        return 2;
    }
    /* stdout is for the ids: what ik prints there itself (deepseek2's decode graph:
     * "update_cache_copies: V has no copy..." every step) goes to stderr */
    FILE *ids_out = fdopen(dup(STDOUT_FILENO), "w");
    if (!ids_out || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        perror("ik_logits: stdout");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* whole lines between stderr's own */
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_mmap = false;
    mp.mla = 1; /* DeepSeek's attn_k_b / attn_v_b made from attn_kv_b at load (llm_prepare_mla) */
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "ik_logits: %s: ik_llama.cpp could not load it\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F16; /* ik: a V cache other than F16/BF16 needs flash attention, whose
                                 CPU kernels take no F32 K/V */
    cp.flash_attn = false;
    /* DeepSeek's latent attention: ik's first MLA form, the one that runs without flash
     * attention (its default, 3, crashes without it); it keeps the latent cache in type_k (F32),
     * the transposed one too. Other architectures ignore it. */
    cp.mla_attn = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "ik_logits: %s: no context\n", argv[1]);
        return 1;
    }
    int vocab = llama_n_vocab(model);
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)total);
    float *logits = malloc(sizeof(float) * (size_t)vocab * (size_t)total);
    for (int i = 0; i < n_given; i++)
        ids[i] = atoi(argv[5 + i]);
    struct llama_batch b = llama_batch_init(total, 0, 1);
    int fed = 0;
    double p1 = 0;
    while (fed < total) {
        int n = fed == 0 ? n_given : 1;
        b.n_tokens = n;
        for (int i = 0; i < n; i++) {
            b.token[i] = ids[fed + i];
            b.pos[i] = fed + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        if (llama_decode(ctx, b)) {
            fprintf(stderr, "ik_logits: llama_decode failed at position %d\n", fed);
            return 1;
        }
        int arg = 0;
        for (int i = 0; i < n; i++) {
            const float *row = llama_get_logits_ith(ctx, i);
            memcpy(logits + (size_t)(fed + i) * vocab, row, sizeof(float) * (size_t)vocab);
            p1 += top1(row, vocab, &arg);
        }
        fed += n;
        if (fed < total && fed >= n_given)
            ids[fed] = arg; /* greedy: the last row's argmax is the next id */
    }
    FILE *f = fopen(out, "wb");
    size_t len = strlen(out);
    int ok = f != NULL;
    if (ok && len > 4 && strcmp(out + len - 4, ".f16") == 0) {
        ggml_fp16_t *h = malloc(sizeof(ggml_fp16_t) * (size_t)vocab * (size_t)total);
        ggml_fp32_to_fp16_row(logits, h, (int64_t)vocab * total);
        ok = fwrite(h, sizeof(*h), (size_t)vocab * total, f) == (size_t)vocab * total;
        free(h);
    } else if (ok)
        ok = fwrite(logits, sizeof(float), (size_t)vocab * total, f) == (size_t)vocab * total;
    if (!f || fclose(f) || !ok) {
        fprintf(stderr, "ik_logits: %s: could not write it\n", out);
        return 1;
    }
    for (int i = 0; i < total; i++)
        fprintf(ids_out, "%s%d", i ? " " : "", ids[i]);
    fprintf(ids_out, "\n");
    fclose(ids_out);
    fprintf(stderr, "mean top-1 probability %.4f over %d positions\n", p1 / total, total);
    llama_batch_free(b);
    free(ids);
    free(logits);
    llama_free(ctx);
    llama_free_model(model);
    llama_backend_free();
    return 0;
}
