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

int coord_llama2c_open(struct coord_llama2c *ck, const char *path, struct shardlm_err *e)
{
    memset(ck, 0, sizeof(*ck));
    struct stat st;
    int fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    int32_t h[7];
    if (st.st_size < (off_t)sizeof(h) || pread(fd, h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
        close(fd);
        return shardlm_fail(e, -EINVAL, "%s: " NOT_A_MODEL "%lld bytes: truncated, or shorter than "
                          "the 28-byte header of a llama2.c checkpoint)", path,
                          (long long)st.st_size);
    }
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                          "n_kv_heads", "vocab_size", "seq_len"};
    static const int32_t limits[7] = {65536, 1 << 20, 1024, 1024, 1024, 1 << 22, 1 << 20};
    for (int i = 0; i < 7; i++) {
        int32_t v = i == 5 && h[i] < 0 && h[i] != INT32_MIN ? -h[i] : h[i];
        if (v <= 0 || v > limits[i]) {
            close(fd);
            return shardlm_fail(e, -EINVAL, "%s: " NOT_A_MODEL "as a llama2.c checkpoint its "
                              "header field %s is %d, expected 1..%d)", path, names[i], h[i],
                              limits[i]);
        }
    }
    struct shlm_config *c = &ck->cfg;
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
    c->rope_neox = 0;
    c->act = SHLM_ACT_SILU;
    if (c->dim % c->n_heads) {
        close(fd);
        return shardlm_fail(e, -EINVAL, "%s: header field n_heads %u does not divide dim %u", path,
                          c->n_heads, c->dim);
    }
    c->head_dim = c->dim / c->n_heads;
    struct shardlm_err cerr;
    if (shlm_config_check(c, &cerr)) {
        close(fd);
        return shardlm_fail(e, -EINVAL, "%s: %s", path, cerr.msg);
    }
    /* every count below is bounded by the limits above, so 64-bit products cannot overflow */
    uint64_t d = c->dim, L = c->n_layers, hid = c->hidden_dim, V = c->vocab_size;
    uint64_t kv = (uint64_t)c->n_kv_heads * c->head_dim, hs = c->head_dim;
    uint64_t floats = V * d + L * d + L * d * d + 2 * L * d * kv + L * d * d + L * d +
                      3 * L * d * hid + d + (uint64_t)c->seq_len * hs + (c->tied_embd ? 0 : V * d);
    uint64_t want = 28 + floats * 4;
    if ((uint64_t)st.st_size != want) {
        close(fd);
        return shardlm_fail(e, -EINVAL, "%s: the header implies %llu bytes but the file has %lld "
                          "(truncated, or not a llama2.c checkpoint)", path,
                          (unsigned long long)want, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return shardlm_fail(e, -errno, "%s: mmap: %s", path, strerror(errno));
    ck->map = map;
    ck->map_bytes = (size_t)st.st_size;
    const float *p = (const float *)((const char *)map + 28);
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
    return 0;
}

void coord_llama2c_close(struct coord_llama2c *ck)
{
    if (ck->map)
        munmap(ck->map, ck->map_bytes);
    memset(ck, 0, sizeof(*ck));
}

const float *coord_llama2c_tensor(const struct coord_llama2c *ck, const char *name)
{
    const struct shlm_config *c = &ck->cfg;
    size_t d = c->dim, hid = c->hidden_dim, kv = (size_t)c->n_kv_heads * c->head_dim;
    if (strcmp(name, "tok_embd") == 0)
        return ck->embd;
    if (strcmp(name, "output") == 0)
        return ck->wcls;
    if (strcmp(name, "output_norm") == 0)
        return ck->rms_final;
    unsigned l;
    char part[SHLM_NAME_MAX];
    if (sscanf(name, "blk.%u.%47s", &l, part) != 2 || l >= c->n_layers)
        return NULL;
    if (strcmp(part, "attn_norm") == 0)
        return ck->rms_att + l * d;
    if (strcmp(part, "ffn_norm") == 0)
        return ck->rms_ffn + l * d;
    if (strcmp(part, "attn_q") == 0)
        return ck->wq + l * d * d;
    if (strcmp(part, "attn_k") == 0)
        return ck->wk + l * d * kv;
    if (strcmp(part, "attn_v") == 0)
        return ck->wv + l * d * kv;
    if (strcmp(part, "attn_o") == 0)
        return ck->wo + l * d * d;
    if (strcmp(part, "ffn_gate") == 0)
        return ck->w1 + l * d * hid;
    if (strcmp(part, "ffn_down") == 0)
        return ck->w2 + l * hid * d;
    if (strcmp(part, "ffn_up") == 0)
        return ck->w3 + l * d * hid;
    return NULL;
}
