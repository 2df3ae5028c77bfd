/* SPDX-License-Identifier: MIT */
/* coordinator/convert/source.c: model sources - the dispatch by content (format/sniff.c), and the
 * llama2.c checkpoint source. */
#include "source.h"

#include "llama2c.h"
#include "sniff.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZER_MAX_BYTES (64u << 20)

int coord_source_open(struct coord_source *s, const char *path, const char *tokenizer,
                      uint32_t max_ctx, struct shardlm_err *e)
{
    memset(s, 0, sizeof(*s));
    enum coord_format fmt;
    int rc = coord_format_sniff(path, &fmt, e);
    if (rc)
        return rc;
    switch (fmt) {
    case COORD_FORMAT_HF_DIR:
        rc = coord_source_hf(s, path, tokenizer, e);
        break;
    case COORD_FORMAT_GGUF:
        rc = coord_source_gguf(s, path, tokenizer, e);
        break;
    case COORD_FORMAT_SHLM:
        rc = shardlm_fail(e, -EINVAL,
                          "%s: a .shlm file, converted already (convert reads GGUF, "
                          "a Hugging Face folder or a llama2.c checkpoint)",
                          path);
        break;
    default: /* no magic: a llama2.c checkpoint, whose reader refuses what is no model at all */
        rc = coord_source_llama2c(s, path, tokenizer, e);
    }
    if (rc)
        return rc;
    s->path = path;
    if (max_ctx && s->cfg.seq_len > max_ctx)
        s->cfg.seq_len = max_ctx;
    return 0;
}

void coord_source_close(struct coord_source *s)
{
    if (s->close)
        s->close(s);
    free(s->tok);
    memset(s, 0, sizeof(*s));
}

int coord_source_check_finite(const float *w, int rows, int cols, const char *path,
                              const char *name, struct shardlm_err *e)
{
    size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(w[i]) && fabsf(w[i]) <= COORD_SOURCE_MAX_WEIGHT)
            continue;
        char shown[100];
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %s: element %zu (row %zu, column %zu) is %g, expected a "
                            "finite weight within +-%g",
                            path, coord_escape_str(shown, sizeof(shown), name), i, i / (size_t)cols,
                            i % (size_t)cols, (double)w[i], (double)COORD_SOURCE_MAX_WEIGHT);
    }
    return 0;
}

void coord_kv_b_split(const struct shlm_config *c, const struct shlm_config_ext *x,
                      enum shlm_kind kind, const float *kvb, float *out)
{
    size_t nh = c->n_heads, nope = c->head_dim - x->rope_dim, vd = shlm_v_dim(c, x),
           kvl = x->kv_lora_rank;
    for (size_t h = 0; h < nh; h++) {
        const float *wk = kvb + h * (nope + vd) * kvl, *wv = wk + nope * kvl;
        if (kind == SHLM_KIND_ATTN_V_B) {
            memcpy(out + h * vd * kvl, wv, vd * kvl * sizeof(float));
            continue;
        }
        float *o = out + h * kvl * nope;
        for (size_t r = 0; r < kvl; r++)
            for (size_t i = 0; i < nope; i++)
                o[r * nope + i] = wk[i * kvl + r];
    }
}

int coord_source_check_kind(enum shlm_kind kind, const float *w, int rows, int cols,
                            const char *path, const char *name, struct shardlm_err *e)
{
    int rc = coord_source_check_finite(w, rows, cols, path, name, e);
    if (rc)
        return rc;
    size_t n = (size_t)rows * (size_t)cols;
    const char *expect;
    for (size_t i = 0; i < n; i++)
        if (!shlm_kind_value_ok(kind, w[i], &expect)) {
            char shown[100];
            return shardlm_fail(e, -EINVAL, "%s: tensor %s: element %zu is %g, expected %s", path,
                                coord_escape_str(shown, sizeof(shown), name), i, (double)w[i],
                                expect);
        }
    return 0;
}

static int llama2c_read(struct coord_source *s, enum shlm_kind kind, uint32_t layer,
                        uint32_t expert, int rows, int cols, float *out, struct shardlm_err *e)
{
    const float *src = expert ? NULL : coord_llama2c_tensor(s->impl, kind, layer);
    if (!src)
        return -ENOENT;
    char name[SHLM_NAME_MAX];
    shlm_kind_name(kind, layer, 0, name, sizeof(name));
    memcpy(out, src, (size_t)rows * (size_t)cols * sizeof(float));
    return coord_source_check_kind(kind, out, rows, cols, s->path, name, e);
}

static void llama2c_close(struct coord_source *s)
{
    coord_llama2c_close(s->impl);
    free(s->impl);
}

int coord_source_llama2c(struct coord_source *s, const char *path, const char *tokenizer,
                         struct shardlm_err *e)
{
    struct coord_llama2c *ck = calloc(1, sizeof(*ck));
    if (!ck)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int rc = coord_llama2c_open(ck, path, e); /* first: is it one at all? */
    if (!rc && !tokenizer) {
        coord_llama2c_close(ck);
        rc = shardlm_fail(e, -EINVAL, "%s: a llama2.c checkpoint needs --tokenizer TOKENIZER.bin",
                          path);
    }
    if (rc) {
        free(ck);
        return rc;
    }
    s->impl = ck;
    s->read = llama2c_read;
    s->close = llama2c_close;
    s->cfg = ck->cfg;
    if ((rc = coord_read_file(tokenizer, TOKENIZER_MAX_BYTES, &s->tok, &s->tok_len, e)))
        goto out_close;
    /* parse it now so a bad or mismatched tokenizer is refused here, not at generation */
    struct coord_tok t;
    if ((rc = coord_tok_init(&t, s->tok, s->tok_len, (int)ck->cfg.vocab_size, tokenizer, e)))
        goto out_close;
    coord_tok_free(&t);
    s->tok_kind = SHLM_TOK_LLAMA2C;
    s->bos_id = 1;
    s->eos_id = 2;
    return 0;
out_close:
    coord_source_close(s);
    return rc;
}
