/* SPDX-License-Identifier: MIT */
/* coordinator/format/sniff.c and rows.c: every format told apart by its content (the magic of
 * each, short and look-alike inputs, what the real writers of each format produce), a file's
 * verdict the same as its image's, the refusals of what is no regular file, named; and the
 * stored row types converted to float32 against values worked out by hand, from unaligned
 * bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "convert.h"
#include "gguf_write.h"
#include "rows.h"
#include "shlm.h"
#include "sniff.h"
#include "testutil.h"
#include "tokenizer.h"

static char dir[4096];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "format");
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

static enum coord_format sniff_str(const char *s, size_t n)
{
    return coord_format_sniff_image((const uint8_t *)s, n);
}

/* The verdict of coord_format_sniff() on @path, which must succeed and agree with the image's. */
static enum coord_format sniff_file(const char *path)
{
    enum coord_format f = (enum coord_format)99; /* not a format: set or caught */
    struct shardlm_err e;
    int rc = coord_format_sniff(path, &f, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    size_t n = 0;
    char *img = tu_slurp(path, &n);
    assert_non_null(img);
    assert_int_equal(coord_format_sniff_image((const uint8_t *)img, n), f);
    free(img);
    return f;
}

static void in_dir(char *out, size_t len, const char *name)
{
    tu_path(out, len, "%s/%s", dir, name);
}

static void test_sniff_image(void **state)
{
    assert_int_equal(sniff_str(SHLM_MAGIC, 8), COORD_FORMAT_SHLM);
    assert_int_equal(sniff_str("GGUF", 4), COORD_FORMAT_GGUF);
    assert_int_equal(sniff_str("GGUF\3\0\0\0", 8), COORD_FORMAT_GGUF);
    assert_int_equal(sniff_str(COORD_FORMAT_TOK_BLOB_MAGIC, 8), COORD_FORMAT_TOK_BLOB);
    assert_int_equal(sniff_str("{\"model\": {}}", 13), COORD_FORMAT_JSON);
    assert_int_equal(sniff_str(" \t\r\n{", 5), COORD_FORMAT_JSON);
    /* cut short or a letter off: no magic */
    assert_int_equal(sniff_str(SHLM_MAGIC, 7), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str("GGU", 3), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str("GGUf", 4), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str(COORD_FORMAT_TOK_BLOB_MAGIC, 7), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str("SHLMTOKx", 8), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str("SHARDLMx", 8), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str("", 0), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str("  \n", 3), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str(" x{", 3), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str("[{}]", 4), COORD_FORMAT_OTHER);
    /* a llama2.c checkpoint header (dim 64 ...) and a tokenizer.bin (max_token_length 7) */
    static const int32_t ck[7] = {64, 172, 2, 4, 2, 512, 512};
    assert_int_equal(coord_format_sniff_image((const uint8_t *)ck, sizeof(ck)), COORD_FORMAT_OTHER);
    static const uint8_t tokbin[] = {7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 'a'};
    assert_int_equal(coord_format_sniff_image(tokbin, sizeof(tokbin)), COORD_FORMAT_OTHER);
}

/* What the project's own writers produce is what the sniffer says: a .shlm from convert, a GGUF
 * from the writer, a blob from coord_tok_save() (its magic is tokenizer.c's, not a copy that
 * could drift), and the stories260K inputs (no magic). */
static void test_sniff_real_files(void **state)
{
    char ck[4200], tok[4200], shlm[4300], gguf[4300], blob[4300];
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    assert_int_equal(sniff_file(ck), COORD_FORMAT_OTHER);
    assert_int_equal(sniff_file(tok), COORD_FORMAT_OTHER);

    in_dir(shlm, sizeof(shlm), "m.shlm");
    struct coord_convert_opts o = {
        .checkpoint = ck, .tokenizer = tok, .out = shlm, .scheme = SHLM_SCHEME_F32, .head_bits = 8};
    struct shardlm_err e;
    assert_int_equal(coord_convert(&o, NULL, &e), 0);
    assert_int_equal(sniff_file(shlm), COORD_FORMAT_SHLM);

    in_dir(gguf, sizeof(gguf), "v.gguf");
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_open(&w, gguf, &e), 0);
    gguf_w_str(w, "general.architecture", "llama");
    assert_int_equal(gguf_writer_close(w, &e), 0);
    assert_int_equal(sniff_file(gguf), COORD_FORMAT_GGUF);

    size_t len = 0;
    char *img = tu_slurp(tok, &len);
    assert_non_null(img);
    struct coord_tok t;
    assert_int_equal(coord_tok_init(&t, (const uint8_t *)img, len, 512, tok, &e), 0);
    uint8_t *b;
    size_t blen;
    assert_int_equal(coord_tok_save(&t, &b, &blen), 0);
    in_dir(blob, sizeof(blob), "t.blob");
    assert_int_equal(tu_write(blob, b, blen), 0);
    assert_int_equal(sniff_file(blob), COORD_FORMAT_TOK_BLOB);
    assert_true(coord_tok_is_blob(b, blen));
    free(b);
    coord_tok_free(&t);
    free(img);
}

static void test_sniff_paths(void **state)
{
    char p[4300], fifo[4300];
    struct shardlm_err e;
    enum coord_format f = COORD_FORMAT_OTHER;
    /* a folder is a Hugging Face model, whatever it holds */
    assert_int_equal(coord_format_sniff(dir, &f, &e), 0);
    assert_int_equal(f, COORD_FORMAT_HF_DIR);
    /* an empty file, a short one, JSON */
    in_dir(p, sizeof(p), "empty");
    assert_int_equal(tu_write(p, "", 0), 0);
    assert_int_equal(sniff_file(p), COORD_FORMAT_OTHER);
    in_dir(p, sizeof(p), "gg");
    assert_int_equal(tu_write(p, "GG", 2), 0);
    assert_int_equal(sniff_file(p), COORD_FORMAT_OTHER);
    in_dir(p, sizeof(p), "tokenizer.json");
    assert_int_equal(tu_write(p, "\n  {\"model\": {}}\n", 17), 0);
    assert_int_equal(sniff_file(p), COORD_FORMAT_JSON);
    /* a file's '{' counts within its first 4096 bytes, as documented; its image's anywhere */
    static char ws[5000];
    memset(ws, ' ', sizeof(ws));
    ws[sizeof(ws) - 1] = '{';
    in_dir(p, sizeof(p), "far.json");
    assert_int_equal(tu_write(p, ws, sizeof(ws)), 0);
    assert_int_equal(coord_format_sniff(p, &f, &e), 0);
    assert_int_equal(f, COORD_FORMAT_OTHER);
    assert_int_equal(sniff_str(ws, sizeof(ws)), COORD_FORMAT_JSON);
    ws[4095] = '{';
    assert_int_equal(tu_write(p, ws, sizeof(ws)), 0);
    assert_int_equal(coord_format_sniff(p, &f, &e), 0);
    assert_int_equal(f, COORD_FORMAT_JSON);

    /* what is not there, and what is no regular file: refused at once, named */
    in_dir(p, sizeof(p), "missing");
    assert_int_equal(coord_format_sniff(p, &f, &e), -ENOENT);
    char want[4400];
    tu_path(want, sizeof(want), "%s: No such file or directory", p);
    assert_string_equal(e.msg, want);
    in_dir(fifo, sizeof(fifo), "fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(coord_format_sniff(fifo, &f, &e), -EINVAL);
    tu_path(want, sizeof(want), "%s: a FIFO, not a regular file", fifo);
    assert_string_equal(e.msg, want);
    assert_int_equal(coord_format_sniff("/dev/null", &f, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "/dev/null: "));
    assert_non_null(strstr(e.msg, "not a regular file"));
}

static void test_rows_traits(void **state)
{
    static const struct {
        enum coord_rows_type t;
        const char *name;
        uint32_t blk, bytes;
    } want[] = {
        {COORD_ROWS_F32, "F32", 1, 4},     {COORD_ROWS_F16, "F16", 1, 2},
        {COORD_ROWS_BF16, "BF16", 1, 2},   {COORD_ROWS_Q8_0, "Q8_0", 32, 34},
        {COORD_ROWS_Q4_0, "Q4_0", 32, 18}, {COORD_ROWS_MXFP4, "MXFP4", 32, 17},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        assert_string_equal(coord_rows_traits[want[i].t].name, want[i].name);
        assert_int_equal(coord_rows_traits[want[i].t].blk, want[i].blk);
        assert_int_equal(coord_rows_traits[want[i].t].blk_bytes, want[i].bytes);
    }
}

/* Each type from bytes at an odd address (the readers hand over file offsets, aligned to
 * nothing in particular for safetensors). */
static void test_rows_to_f32(void **state)
{
    uint8_t raw[1 + 2 * 34];
    uint8_t *src = raw + 1;
    float out[64];

    const float f32[3] = {1.5f, -0.0f, 3e38f};
    memcpy(src, f32, sizeof(f32));
    coord_rows_to_f32(COORD_ROWS_F32, src, 3, out);
    assert_memory_equal(out, f32, sizeof(f32));

    /* F16: 1.0, -2.0, 65504 (largest), 2^-24 (smallest subnormal) */
    const uint16_t h[4] = {0x3c00, 0xc000, 0x7bff, 0x0001};
    memcpy(src, h, sizeof(h));
    coord_rows_to_f32(COORD_ROWS_F16, src, 4, out);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 65504.0f);
    assert_true(out[3] == 0x1p-24f);

    /* BF16: the high half of the float */
    const uint16_t b[3] = {0x3f80, 0xc049, 0x4380};
    memcpy(src, b, sizeof(b));
    coord_rows_to_f32(COORD_ROWS_BF16, src, 3, out);
    assert_true(out[0] == 1.0f && out[1] == -3.140625f && out[2] == 256.0f);

    /* Q8_0, two blocks: scales 0.5 and -0.25 (fp16), q = j - 16 and 3 * j - 50 */
    for (int k = 0; k < 2; k++) {
        uint8_t *blk = src + 34 * k;
        uint16_t d = k ? 0xb400 : 0x3800;
        memcpy(blk, &d, 2);
        for (int j = 0; j < 32; j++)
            blk[2 + j] = (uint8_t)(int8_t)(k ? 3 * j - 50 : j - 16);
    }
    coord_rows_to_f32(COORD_ROWS_Q8_0, src, 64, out);
    for (int j = 0; j < 32; j++) {
        assert_true(out[j] == 0.5f * (float)(j - 16));
        assert_true(out[32 + j] == -0.25f * (float)(3 * j - 50));
    }

    /* Q4_0, two blocks: scale 2 then 1; byte j holds element j low, element j + 16 high */
    for (int k = 0; k < 2; k++) {
        uint8_t *blk = src + 18 * k;
        uint16_t d = k ? 0x3c00 : 0x4000;
        memcpy(blk, &d, 2);
        for (int j = 0; j < 16; j++)
            blk[2 + j] = (uint8_t)((k ? j : 15 - j) | (k ? 15 - j : j) << 4);
    }
    coord_rows_to_f32(COORD_ROWS_Q4_0, src, 64, out);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == 2.0f * (float)(15 - j - 8));
        assert_true(out[16 + j] == 2.0f * (float)(j - 8));
        assert_true(out[32 + j] == (float)(j - 8));
        assert_true(out[48 + j] == (float)(15 - j - 8));
    }

    /* MXFP4, two blocks: exponents 128 (scale 1) and 125 (1/8); nibble v: E2M1 value (doubled)
     * of v & 7, negative where v & 8; byte j holds element j low, element j + 16 high */
    static const float e2m1[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    for (int k = 0; k < 2; k++) {
        uint8_t *blk = src + 17 * k;
        blk[0] = k ? 125 : 128;
        for (int j = 0; j < 16; j++)
            blk[1 + j] = (uint8_t)(j | (15 - j) << 4);
    }
    coord_rows_to_f32(COORD_ROWS_MXFP4, src, 64, out);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 16; j++) {
            float d = k ? 0.125f : 1.0f;
            int lo = j, hi = 15 - j;
            assert_true(out[32 * k + j] == d * (lo & 8 ? -1.0f : 1.0f) * e2m1[lo & 7]);
            assert_true(out[32 * k + 16 + j] == d * (hi & 8 ? -1.0f : 1.0f) * e2m1[hi & 7]);
        }
}

/* MXFP4 encoding: values on a block's grid come back exactly (any exponent the values allow,
 * signs, zeros); others to the nearest grid value, the largest magnitude within 12 scales; a
 * round trip of rounded values is the identity. */
static void test_rows_mxfp4_encode(void **state)
{
    (void)state;
    static const float e2m1[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    uint8_t blk[17];
    float x[32], y[32], z[32];
    for (int e = -20; e <= 20; e += 5) {
        for (int j = 0; j < 32; j++)
            x[j] = ldexpf((j % 3 || !((j * 5) % 8) ? 1.0f : -1.0f) * e2m1[(j * 5) % 8], e);
        x[7] = ldexpf(12.0f, e); /* the largest, so the scale is 2^e */
        coord_rows_mxfp4_block(x, blk);
        coord_rows_to_f32(COORD_ROWS_MXFP4, blk, 32, y);
        assert_memory_equal(x, y, sizeof(x));
    }
    uint64_t r = 12345;
    for (int trial = 0; trial < 200; trial++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[j] = ((float)(int32_t)(r >> 32) / 2147483648.0f) * ldexpf(1.0f, trial % 13 - 6);
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        }
        coord_rows_mxfp4_block(x, blk);
        float d = ldexpf(1.0f, (int)blk[0] - 128);
        assert_true(amax <= 12.0f * d && amax > 6.0f * d); /* the smallest scale that holds it */
        coord_rows_to_f32(COORD_ROWS_MXFP4, blk, 32, y);
        for (int j = 0; j < 32; j++) {
            float best = INFINITY; /* the nearest grid value is as near as y[j] */
            for (int v = 0; v < 8; v++)
                best = fminf(best, fabsf(fabsf(x[j]) - d * e2m1[v]));
            assert_true(fabsf(x[j] - y[j]) <= best * (1.0f + 1e-6f));
        }
        coord_rows_mxfp4_block(y, blk);
        coord_rows_to_f32(COORD_ROWS_MXFP4, blk, 32, z);
        assert_memory_equal(y, z, sizeof(y));
    }
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sniff_image), cmocka_unit_test(test_sniff_real_files),
        cmocka_unit_test(test_sniff_paths), cmocka_unit_test(test_rows_traits),
        cmocka_unit_test(test_rows_to_f32), cmocka_unit_test(test_rows_mxfp4_encode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
