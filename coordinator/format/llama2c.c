/* SPDX-License-Identifier: MIT */
/* coordinator/format/llama2c.c: the llama2.c checkpoint reader (header checks, the weights
 * mapped in place); a file that is no model at all is told so here, llama2.c having no magic. */
#include "llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a file that is no format we know gets told: llama2.c checkpoints have no magic, so they
 * are what is left, and an implausible header means the file is none of them. */
#define NOT_A_MODEL                                                                                \
    "not a GGUF file, a .shlm file, a Hugging Face folder or a llama2.c checkpoint ("

/* Reads the 7-field header of @path (open as @fd, @size bytes) into @h, each field in range
 * (a negative vocab_size by its magnitude). */
static int read_header(int fd, off_t size, const char *path, int32_t h[7], struct shardlm_err *e)
{
    if (size < 28 || pread(fd, h, 28, 0) != 28)
        return shardlm_fail(e, -EINVAL,
                            "%s: " NOT_A_MODEL "%lld bytes: truncated, or shorter than "
                            "the 28-byte header of a llama2.c checkpoint)",
                            path, (long long)size);
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                          "n_kv_heads", "vocab_size", "seq_len"};
    static const int32_t limits[7] = {65536, 1 << 20, 1024, 1024, 1024, 1 << 22, 1 << 20};
    for (int i = 0; i < 7; i++) {
        int32_t v = i == 5 && h[i] < 0 && h[i] != INT32_MIN ? -h[i] : h[i];
        if (v <= 0 || v > limits[i])
            return shardlm_fail(e, -EINVAL,
                                "%s: " NOT_A_MODEL "as a llama2.c checkpoint its "
                                "header field %s is %d, expected 1..%d)",
                                path, names[i], h[i], limits[i]);
    }
    return 0;
}

/* The model config of header @h, with what llama2.c fixes (eps, theta, interleaved RoPE, SiLU),
 * checked as the runtime checks every config. */
static int header_config(const int32_t h[7], struct shlm_config *c, const char *path,
                         struct shardlm_err *e)
{
    c->arch = SHLM_ARCH_LLAMA;
    c->dim = (uint32_t)h[0];
    c->hidden_dim = (uint32_t)h[1];
    c->n_layers = (uint32_t)h[2];
    c->n_heads = (uint32_t)h[3];
    c->n_kv_heads = (uint32_t)h[4];
    c->tied_embd = h[5] > 0;
    c->vocab_size = (uint32_t)(h[5] > 0 ? h[5] : -h[5]);
    c->seq_len = (uint32_t)h[6];
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    shlm_arch_apply(&shlm_archs[SHLM_FAMILY_LLAMA2C], false, c); /* interleaved RoPE, SiLU */
    if (c->dim % c->n_heads)
        return shardlm_fail(e, -EINVAL, "%s: header field n_heads %u does not divide dim %u", path,
                            c->n_heads, c->dim);
    c->head_dim = c->dim / c->n_heads;
    struct shardlm_err cerr;
    if (shlm_config_check(c, &cerr))
        return shardlm_fail(e, -EINVAL, "%s: %s", path, cerr.msg);
    return 0;
}

/* The file size config @c implies: the header and every float32 weight in run.c's order. Every
 * count is bounded by read_header's limits, so the 64-bit products cannot overflow. */
static uint64_t implied_bytes(const struct shlm_config *c)
{
    uint64_t d = c->dim, L = c->n_layers, hid = c->hidden_dim, V = c->vocab_size;
    uint64_t kv = (uint64_t)c->n_kv_heads * c->head_dim, hs = c->head_dim;
    uint64_t floats = V * d + L * d + L * d * d + 2 * L * d * kv + L * d * d + L * d +
                      3 * L * d * hid + d + (uint64_t)c->seq_len * hs + (c->tied_embd ? 0 : V * d);
    return 28 + floats * 4;
}

/* Points the weights of @ck into its mapping, in run.c's order. */
static void place_weights(struct coord_llama2c *ck)
{
    const struct shlm_config *c = &ck->cfg;
    uint64_t d = c->dim, L = c->n_layers, hid = c->hidden_dim, V = c->vocab_size;
    uint64_t kv = (uint64_t)c->n_kv_heads * c->head_dim, hs = c->head_dim;
    const float *p = (const float *)((const char *)ck->map + 28);
    ck->base = p;
    ck->embd = p;
    p += V * d;
    ck->rms_att = p;
    p += L * d;
    ck->wq = p;
    p += L * d * d;
    ck->wk = p;
    p += L * d * kv;
    ck->wv = p;
    p += L * d * kv;
    ck->wo = p;
    p += L * d * d;
    ck->rms_ffn = p;
    p += L * d;
    ck->w1 = p;
    p += L * d * hid;
    ck->w2 = p;
    p += L * hid * d;
    ck->w3 = p;
    p += L * d * hid;
    ck->rms_final = p;
    p += d;
    p += (uint64_t)c->seq_len * hs; /* freq_cis_real and _imag: RoPE is computed, not read */
    ck->wcls = c->tied_embd ? ck->embd : p;
}

int coord_llama2c_open(struct coord_llama2c *ck, const char *path, struct shardlm_err *e)
{
    memset(ck, 0, sizeof(*ck));
    struct stat st;
    int fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    int32_t h[7];
    int rc = read_header(fd, st.st_size, path, h, e);
    if (!rc)
        rc = header_config(h, &ck->cfg, path, e);
    if (rc)
        goto out_close_fd;
    uint64_t want = implied_bytes(&ck->cfg);
    if ((uint64_t)st.st_size != want) {
        rc = shardlm_fail(e, -EINVAL,
                          "%s: the header implies %llu bytes but the file has %lld "
                          "(truncated, or not a llama2.c checkpoint)",
                          path, (unsigned long long)want, (long long)st.st_size);
        goto out_close_fd;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = shardlm_fail(e, -errno, "%s: mmap: %s", path, strerror(errno));
        goto out_close_fd;
    }
    ck->map = map;
    ck->map_bytes = (size_t)st.st_size;
    place_weights(ck);
out_close_fd:
    close(fd);
    return rc;
}

void coord_llama2c_close(struct coord_llama2c *ck)
{
    if (ck->map)
        munmap(ck->map, ck->map_bytes);
    memset(ck, 0, sizeof(*ck));
}

const float *coord_llama2c_tensor(const struct coord_llama2c *ck, enum shlm_kind k, uint32_t l)
{
    const struct shlm_config *c = &ck->cfg;
    if ((unsigned)k >= SHLM_KIND_COUNT || l >= (shlm_kinds[k].layer ? c->n_layers : 1))
        return NULL;
    /* the kind's slot, then its layer's matrix within it */
    const struct shlm_kind_traits *t = &shlm_kinds[k];
    const float *const slots[SHLM_L2C_COUNT] = {
        [SHLM_L2C_EMBD] = ck->embd,
        [SHLM_L2C_RMS_ATT] = ck->rms_att,
        [SHLM_L2C_WQ] = ck->wq,
        [SHLM_L2C_WK] = ck->wk,
        [SHLM_L2C_WV] = ck->wv,
        [SHLM_L2C_WO] = ck->wo,
        [SHLM_L2C_RMS_FFN] = ck->rms_ffn,
        [SHLM_L2C_W1] = ck->w1,
        [SHLM_L2C_W2] = ck->w2,
        [SHLM_L2C_W3] = ck->w3,
        [SHLM_L2C_RMS_FINAL] = ck->rms_final,
        [SHLM_L2C_WCLS] = ck->wcls,
    };
    const float *base = slots[t->l2c];
    if (!base)
        return NULL;
    return base + (size_t)l * (size_t)shlm_dim_size(c, NULL, t->rows) *
                      (size_t)shlm_dim_size(c, NULL, t->cols);
}
