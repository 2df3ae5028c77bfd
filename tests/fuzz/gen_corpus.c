/* SPDX-License-Identifier: MIT */
/* Writes the seed corpora of the fuzz targets (checked in under tests/fuzz/corpus/, regenerate
 * with: build/tests/fuzz/fuzz_gen_corpus tests/fuzz/corpus models/stories260K/tok512.bin).
 *
 *   shlm/       minimal valid .shlm images (1 layer, dim 8: 12 or 13 tensors of a few hundred
 *               bytes, each on its own 4 KiB page, so ~50 KB) in three schemes, the f32 one
 *               again with a corrupt tensor, and short heads with one header or table field
 *               broken each. Names carry no .shlm suffix: .gitignore drops *.shlm.
 *   tokenizer/  2-byte vocabulary prefix + tok512.bin (whole, or its first 146 tokens = 2 KB)
 *               and corrupt variants.
 *   proto/      one packed Envelope of each kind, and broken frames.
 *
 * Every file is deterministic; the valid images are checked with shlm_parse() and
 * shlm_verify_data() before they are written. Files it does not write (fuzzer finds added by
 * hand, such as proto/field-zero-overlong-tag) are left alone. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kn.h"
#include "shardlm.pb-c.h"
#include "shlm.h"

static const char *root;

static void die(const char *what)
{
    fprintf(stderr, "gen_corpus: %s\n", what);
    exit(1);
}

static void put(const char *sub, const char *name, const void *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", root, sub);
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        die(path);
    snprintf(path, sizeof(path), "%s/%s/%s", root, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0)
        die(path);
}

/* ---- shlm ---------------------------------------------------------------------------------- */

/* A 5-token llama2.c vocabulary: <unk> <s> </s> " " "a" (max_token_length 5). */
static size_t tiny_tokenizer(uint8_t *out)
{
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", " ", "a"};
    int32_t maxlen = 5;
    size_t off = 0;
    memcpy(out, &maxlen, 4);
    off += 4;
    for (int i = 0; i < 5; i++) {
        float score = (float)-i;
        int32_t n = (int32_t)strlen(pieces[i]);
        memcpy(out + off, &score, 4);
        memcpy(out + off + 4, &n, 4);
        memcpy(out + off + 8, pieces[i], (size_t)n);
        off += 8 + (size_t)n;
    }
    return off;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Builds a valid image of the tiny model in @scheme into a malloc'd buffer; returns its size. */
static size_t build_shlm(uint8_t **out, enum shlm_scheme scheme, int group, int head_bits,
                         bool tied)
{
    struct shlm_config cfg = {.arch = SHLM_ARCH_LLAMA, .dim = 8, .hidden_dim = 12, .n_layers = 1,
                              .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .vocab_size = 5,
                              .seq_len = 16, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                              .tied_embd = tied};
    struct shardlm_err err;
    if (shlm_config_check(&cfg, &err))
        die(err.msg);
    struct shlm_tensor_spec specs[16] = {0}; /* names are copied whole: no stack bytes */
    int n = shlm_expected_tensors(&cfg, &(struct shlm_config_ext){0}, scheme, group, head_bits,
                                  NULL, specs, 16);
    if (n < 0)
        die("shlm_expected_tensors");
    uint8_t tok[128];
    size_t toklen = tiny_tokenizer(tok);

    struct shlm_header h = {0};
    struct shlm_tensor table[16] = {0};
    memcpy(h.magic, SHLM_MAGIC, sizeof(SHLM_MAGIC));
    h.version = SHLM_VERSION;
    h.header_bytes = sizeof(h);
    h.cfg = cfg;
    h.scheme = scheme;
    h.group = (uint32_t)group;
    h.head_bits = group ? (uint32_t)head_bits : 0;
    h.n_tensors = (uint32_t)n;
    h.table_offset = sizeof(h);
    h.tok_offset = h.table_offset + (uint64_t)n * sizeof(struct shlm_tensor);
    h.tok_bytes = toklen;
    h.tok_kind = SHLM_TOK_LLAMA2C;
    h.bos_id = 1;
    h.eos_id = 2;
    h.data_offset = align_up(h.tok_offset + toklen, SHLM_ALIGN);
    uint64_t off = h.data_offset;
    for (int i = 0; i < n; i++) {
        struct shlm_tensor *t = &table[i];
        memcpy(t->name, specs[i].name, SHLM_NAME_MAX);
        t->dtype = (uint32_t)specs[i].dtype;
        t->group = (uint32_t)specs[i].group;
        t->rows = (uint32_t)specs[i].rows;
        t->cols = (uint32_t)specs[i].cols;
        t->bytes = kn_mat_bytes(specs[i].dtype, specs[i].rows, specs[i].cols, specs[i].group);
        t->offset = off;
        off = i + 1 < n ? align_up(off + t->bytes, SHLM_ALIGN) : off + t->bytes;
    }
    h.file_bytes = off; /* the last tensor is not padded: the file ends with it */

    uint8_t *img = calloc(1, off);
    if (!img)
        die("out of memory");
    uint32_t rng = 12345;
    for (int i = 0; i < n; i++) {
        struct shlm_tensor *t = &table[i];
        size_t cnt = (size_t)t->rows * t->cols;
        float *w = malloc(cnt * sizeof(float));
        for (size_t j = 0; j < cnt; j++) {
            rng = rng * 1664525u + 1013904223u;
            w[j] = ((float)(rng >> 8) / 16777216.0f - 0.5f) * 0.2f;
        }
        void *dst = img + t->offset;
        switch (specs[i].dtype) {
        case KN_DT_F32:
            memcpy(dst, w, cnt * sizeof(float));
            break;
        case KN_DT_BF16:
            kn_quant_bf16(w, cnt, dst);
            break;
        case KN_DT_Q8:
            kn_quant_q8(w, specs[i].rows, specs[i].cols, dst);
            break;
        case KN_DT_Q6:
            kn_quant_q6(w, specs[i].rows, specs[i].cols, dst, NULL);
            break;
        case KN_DT_W4A16:
            kn_quant_w4a16(w, specs[i].rows, specs[i].cols, specs[i].group, dst);
            break;
        case KN_DT_W4A8:
            kn_quant_w4a8(w, specs[i].rows, specs[i].cols, specs[i].group, dst);
            break;
        case KN_DT_W4A8_T: /* not a file layout */
        case KN_DT_W4A16_T:
            abort();
        }
        free(w);
        t->checksum = shlm_hash(dst, t->bytes);
    }
    h.checksum = shlm_hash(&h, sizeof(h)) ^ shlm_hash(table, (size_t)n * sizeof(*table));
    memcpy(img, &h, sizeof(h));
    memcpy(img + h.table_offset, table, (size_t)n * sizeof(*table));
    memcpy(img + h.tok_offset, tok, toklen);

    struct shlm_model m;
    if (shlm_parse(&m, img, off, "gen", &err) ||
        shlm_verify_data(&m, "gen", &err))
        die(err.msg);
    *out = img;
    return off;
}

/* Recomputes the header checksum of the @len-byte image after an edit of the header or the
 * table, when the table lies inside it (else the stale checksum stays: the parser refuses the
 * table first). */
static void reseal(uint8_t *img, size_t len)
{
    struct shlm_header *h = (struct shlm_header *)img;
    uint64_t table = (uint64_t)h->n_tensors * sizeof(struct shlm_tensor);
    if (h->table_offset > len || table > len - h->table_offset)
        return;
    h->checksum = 0;
    h->checksum = shlm_hash(h, sizeof(*h)) ^ shlm_hash(img + h->table_offset, table);
}

static void gen_shlm(void)
{
    uint8_t *img, *other;
    size_t len = build_shlm(&img, SHLM_SCHEME_F32, 0, 8, true);
    put("shlm", "valid-f32-tied", img, len);
    size_t olen = build_shlm(&other, SHLM_SCHEME_W4A8, 32, 8, false);
    put("shlm", "valid-w4a8-untied-q8head", other, olen);
    free(other);
    olen = build_shlm(&other, SHLM_SCHEME_W4A16, 64, 4, true);
    put("shlm", "valid-w4a16-tied-w4head", other, olen);
    free(other);

    /* one flipped data byte: parses, fails shlm_verify_data */
    struct shlm_header *h = (struct shlm_header *)img;
    struct shlm_tensor *t = (struct shlm_tensor *)(img + h->table_offset);
    img[t[3].offset] ^= 0x40;
    put("shlm", "bad-data-checksum", img, len);
    img[t[3].offset] ^= 0x40;

    /* small ones: heads of the image; with the fuzzer's resealing they reach the table checks */
    put("shlm", "head-1000", img, 1000);
    put("shlm", "head-511", img, 511);
    put("shlm", "empty", img, 0);

    /* header and table corruptions, each on a head of the image (up to the end of the tokenizer,
     * or of the second tensor where the check comes after the first tensors' bounds) with
     * file_bytes set to its length and the header checksum recomputed, so that each one
     * reaches the check it is named after */
    static uint8_t part[3 * SHLM_ALIGN];
    const size_t hlen = h->tok_offset + h->tok_bytes, two = t[1].offset + t[1].bytes;
    struct shlm_header *ph = (struct shlm_header *)part;
    struct shlm_tensor *pt = (struct shlm_tensor *)(part + sizeof(struct shlm_header));
#define VARIANT(name, len, edit)                                                                   \
    memcpy(part, img, len);                                                                        \
    ph->file_bytes = len;                                                                          \
    edit;                                                                                          \
    reseal(part, len);                                                                             \
    put("shlm", name, part, len)
    VARIANT("bad-magic", hlen, ph->magic[0] = 'X');
    VARIANT("bad-version", hlen, ph->version = 2);
    VARIANT("bad-n-tensors", hlen, ph->n_tensors = 4097);
    VARIANT("bad-table-offset", hlen, ph->table_offset = 4000);
    VARIANT("bad-tok-kind", hlen, ph->tok_kind = 7);
    VARIANT("bad-config-heads", hlen, ph->cfg.n_kv_heads = 3);
    VARIANT("bad-config-eps", hlen, ph->cfg.norm_eps = 0.0f / 0.0f);
    VARIANT("bad-scheme", hlen, ph->scheme = 9);
    VARIANT("bad-scheme-group", hlen, ph->scheme = SHLM_SCHEME_W4A8); /* with group 0 */
    VARIANT("bad-bos", hlen, ph->bos_id = 5);
    VARIANT("bad-tensor-name", hlen, memset(pt[0].name, 'x', SHLM_NAME_MAX));
    VARIANT("bad-tensor-dtype", hlen, pt[0].dtype = 7);
    VARIANT("tensor-past-end", hlen, (void)0);
    VARIANT("duplicate-tensor", two, memcpy(pt[1].name, pt[0].name, SHLM_NAME_MAX));
    VARIANT("tensor-misaligned", two, pt[1].offset += 8);
#undef VARIANT
    /* a stale header checksum */
    memcpy(part, img, hlen);
    ph->file_bytes = hlen;
    put("shlm", "bad-header-checksum", part, hlen);
    free(img);
}

/* ---- tokenizer ----------------------------------------------------------------------------- */

/* Writes the 2-byte prefix that selects @vocab (1..1024), then @body. */
static void put_tok(const char *name, int vocab, const uint8_t *body, size_t len)
{
    uint8_t *b = malloc(len + 2);
    b[0] = (uint8_t)((vocab - 1) & 0xff);
    b[1] = (uint8_t)((vocab - 1) >> 8);
    memcpy(b + 2, body, len);
    put("tokenizer", name, b, len + 2);
    free(b);
}

static void gen_tokenizer(const char *tokpath)
{
    FILE *f = fopen(tokpath, "rb");
    if (!f)
        die(tokpath);
    static uint8_t tok[16384];
    size_t len = fread(tok, 1, sizeof(tok), f);
    fclose(f);
    /* the end of each token's entry */
    size_t ends[600], off = 4;
    for (int i = 0; i < 512; i++) {
        int32_t n;
        memcpy(&n, tok + off + 4, 4);
        off += 8 + (size_t)n;
        ends[i] = off;
    }
    if (off != len)
        die("tok512.bin is not a 512-token tokenizer");
    /* the largest whole-token head that fits in 2 KB: 146 tokens, 2046 bytes */
    int k = 0;
    while (ends[k] <= 2048)
        k++;
    size_t head = ends[k - 1];

    put_tok("tok512-full", 512, tok, len);
    put_tok("tok512-head", k, tok, head);
    put_tok("tok512-head-trailing-byte", k, tok, head + 1);
    put_tok("tok512-head-one-token-short", k + 1, tok, head);
    put_tok("tok512-head-cut-in-token", k, tok, head - 3);
    put_tok("tok512-head-wrong-vocab", 1024, tok, head);
    put_tok("tok512-head-4-bytes", k, tok, 4);
    put_tok("only-prefix", 1, tok, 0);

    uint8_t c[2048];
    memcpy(c, tok, head);
    int32_t v = -5; /* negative length of token 0 */
    memcpy(c + 8, &v, 4);
    put_tok("tok512-head-negative-length", k, c, head);
    memcpy(c, tok, head);
    v = 0; /* max_token_length 0 */
    memcpy(c, &v, 4);
    put_tok("tok512-head-maxlen-0", k, c, head);
    memcpy(c, tok, head);
    v = 3; /* "<unk>" (5 bytes) longer than max_token_length */
    memcpy(c, &v, 4);
    put_tok("tok512-head-maxlen-3", k, c, head);
}

/* ---- proto --------------------------------------------------------------------------------- */

static void put_env(const char *name, const Shardlm__Envelope *env)
{
    uint8_t buf[1024];
    size_t n = shardlm__envelope__get_packed_size(env);
    if (n > sizeof(buf))
        die("envelope too big");
    shardlm__envelope__pack(env, buf);
    put("proto", name, buf, n);
}

static void gen_proto(void)
{
    Shardlm__Envelope env = SHARDLM__ENVELOPE__INIT;
    Shardlm__Hello hello = SHARDLM__HELLO__INIT;
    hello.rank = 3;
    hello.pid = 4242;
    hello.protocol = 1;
    hello.isa = "avx512";
    env.msg_case = SHARDLM__ENVELOPE__MSG_HELLO;
    env.hello = &hello;
    put_env("hello", &env);

    Shardlm__Attach attach = SHARDLM__ATTACH__INIT;
    attach.rank = 1;
    attach.n_ranks = 2;
    attach.weights_path = "/dev/shm/shardlm-0/100.weights";
    attach.kv_path = "/dev/shm/shardlm-0/100.kv1";
    attach.exchange_path = "/dev/shm/shardlm-0/100.exchange";
    attach.weights_bytes = 1ull << 33;
    attach.kv_bytes = 123456789;
    attach.exchange_bytes = 65536;
    env.msg_case = SHARDLM__ENVELOPE__MSG_ATTACH;
    env.attach = &attach;
    put_env("attach", &env);

    Shardlm__Ready ready = SHARDLM__READY__INIT;
    ready.rank = 1;
    ready.weights_bytes = 1ull << 33;
    env.msg_case = SHARDLM__ENVELOPE__MSG_READY;
    env.ready = &ready;
    put_env("ready", &env);

    Shardlm__StepSeq s[3] = {SHARDLM__STEP_SEQ__INIT, SHARDLM__STEP_SEQ__INIT,
                             SHARDLM__STEP_SEQ__INIT};
    Shardlm__StepSeq *sp[3] = {&s[0], &s[1], &s[2]};
    for (int i = 0; i < 3; i++) {
        s[i].seq_id = (uint32_t)i;
        s[i].pos = 10u * (uint32_t)i;
        s[i].n_tokens = (uint32_t)i + 1;
        s[i].token_offset = (uint32_t)(i * (i + 1) / 2);
        s[i].all_logits = i == 1;
        s[i].logits_row = (uint32_t)i;
    }
    Shardlm__Step step = SHARDLM__STEP__INIT;
    step.step_id = 77;
    step.kind = SHARDLM__STEP_KIND__STEP_PREFILL;
    step.n_seqs = 3;
    step.seqs = sp;
    env.msg_case = SHARDLM__ENVELOPE__MSG_STEP;
    env.step = &step;
    put_env("step-3-seqs", &env);

    Shardlm__StepDone done = SHARDLM__STEP_DONE__INIT;
    done.step_id = 77;
    done.compute_ns = 1234567;
    env.msg_case = SHARDLM__ENVELOPE__MSG_STEP_DONE;
    env.step_done = &done;
    put_env("step-done", &env);

    Shardlm__Heartbeat hb = SHARDLM__HEARTBEAT__INIT;
    hb.seq = 9;
    hb.reply = true;
    env.msg_case = SHARDLM__ENVELOPE__MSG_HEARTBEAT;
    env.heartbeat = &hb;
    put_env("heartbeat", &env);

    Shardlm__Shutdown sd = SHARDLM__SHUTDOWN__INIT;
    sd.reason = "coordinator exiting";
    env.msg_case = SHARDLM__ENVELOPE__MSG_SHUTDOWN;
    env.shutdown = &sd;
    put_env("shutdown", &env);

    Shardlm__Error er = SHARDLM__ERROR__INIT;
    er.code = -5;
    er.message = "worker 1: mbind: Input/output error";
    er.step_id = 77;
    env.msg_case = SHARDLM__ENVELOPE__MSG_ERROR;
    env.error = &er;
    put_env("error", &env);

    /* broken frames: empty (no oneof), a truncated Step, an unknown field, a bad wire type */
    put("proto", "empty", "", 0);
    uint8_t buf[1024];
    env.msg_case = SHARDLM__ENVELOPE__MSG_STEP;
    env.step = &step;
    size_t n = shardlm__envelope__pack(&env, buf);
    put("proto", "step-truncated", buf, n - 3);
    static const uint8_t unknown[] = {0x78 /* field 15, varint */, 0x01, 0x32, 0x02, 0x08, 0x05};
    put("proto", "unknown-field-then-heartbeat", unknown, sizeof(unknown));
    static const uint8_t badwire[] = {0x0f, 0x01};
    put("proto", "bad-wire-type", badwire, sizeof(badwire));
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s CORPUS_ROOT TOK512_BIN\n", argv[0]);
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) < 0 && errno != EEXIST)
        die(root);
    gen_shlm();
    gen_tokenizer(argv[2]);
    gen_proto();
    return 0;
}
