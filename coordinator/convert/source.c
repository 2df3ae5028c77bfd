/* coordinator/: model sources - dispatch by content, and the llama2.c checkpoint source. */
#include "source.h"

#include "llama2c.h"
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOKENIZER_MAX_BYTES (64u << 20)

int coord_source_open(struct coord_source *s, const char *path, const char *tokenizer,
                      uint32_t max_ctx, struct shardlm_err *e)
{
    memset(s, 0, sizeof(*s));
    struct stat st;
    if (stat(path, &st) < 0)
        return shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
    int rc;
    if (S_ISDIR(st.st_mode)) {
        rc = coord_source_hf(s, path, tokenizer, e);
    } else {
        char magic[8] = {0};
        int fd = coord_open_regular(path, &st, e);
        if (fd < 0)
            return fd;
        ssize_t n = read(fd, magic, sizeof(magic));
        close(fd);
        if (n >= 4 && memcmp(magic, "GGUF", 4) == 0)
            rc = coord_source_gguf(s, path, tokenizer, e);
        else if (n == 8 && memcmp(magic, SHLM_MAGIC, sizeof(SHLM_MAGIC)) == 0)
            rc = shardlm_fail(e, -EINVAL, "%s: a .shlm file, converted already (convert reads GGUF, "
                            "a Hugging Face folder or a llama2.c checkpoint)", path);
        else
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

static int llama2c_read(struct coord_source *s, const char *name, int rows, int cols, float *out,
                        struct shardlm_err *e)
{
    const float *src = coord_llama2c_tensor(s->impl, name);
    if (!src)
        return -ENOENT;
    memcpy(out, src, (size_t)rows * (size_t)cols * sizeof(float));
    return 0;
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
