/* SPDX-License-Identifier: MIT */
/* coordinator/tok: llama2.c SentencePiece-BPE encode/decode against the golden ids, and
 * hostile tokenizer.bin files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "testutil.h"
#include "tokenizer.h"

/* @rel in the test data (@data) or the source tree */
static uint8_t *load(const char *rel, size_t *len, int data)
{
    char path[4200];
    tu_path(path, sizeof(path), "%s/%s", data ? tu_data() : tu_src(), rel);
    uint8_t *b = (uint8_t *)tu_slurp(path, len);
    assert_non_null(b);
    return b;
}

static void test_golden_prompt_ids(void **state)
{
    size_t len, tl;
    uint8_t *buf = load("models/stories260K/tok512.bin", &len, 0);
    struct coord_tok t;
    struct shardlm_err e;
    assert_int_equal(coord_tok_init(&t, buf, len, 512, "tok512.bin", &e), 0);
    char *tsv = (char *)load("golden/stories260K/greedy.tsv", &tl, 1);
    int lines = 0;
    for (char *save, *line = strtok_r(tsv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *tab = strchr(line, '\t');
        *tab = 0;
        int32_t want[64], got[64];
        int nw = 0;
        for (char *p = tab + 1; *p && *p != '\t';) {
            char *end;
            want[nw++] = (int32_t)strtol(p, &end, 10);
            p = end;
            while (*p == ' ')
                p++;
        }
        int ng = coord_tok_encode(&t, line, true, false, got, 64);
        assert_int_equal(ng, nw);
        assert_memory_equal(got, want, (size_t)nw * sizeof(int32_t));
        /* decode(encode(x)) == x: pieces after BOS, leading space dropped */
        char text[512] = "";
        size_t tlen = 0;
        for (int i = 1; i < ng; i++) {
            size_t pl;
            const char *piece = coord_tok_decode(&t, got[i - 1], got[i], &pl);
            memcpy(text + tlen, piece, pl);
            tlen += pl;
        }
        text[tlen] = 0;
        assert_string_equal(text, line);
        lines++;
    }
    assert_int_equal(lines, 4);
    /* too small an output buffer is refused, not overrun */
    int32_t small[2];
    assert_int_equal(coord_tok_encode(&t, "Once upon a time", true, false, small, 2), -ENOSPC);
    /* the empty text is BOS only; EOS on request */
    assert_int_equal(coord_tok_encode(&t, "", true, true, small, 2), 2);
    assert_int_equal(small[0], 1);
    assert_int_equal(small[1], 2);
    coord_tok_free(&t);
    free(tsv);
    free(buf);
}

/* Characters outside a 512-token vocabulary fall back to byte tokens and decode back. */
static void test_byte_fallback(void **state)
{
    size_t len;
    uint8_t *buf = load("models/stories260K/tok512.bin", &len, 0);
    struct coord_tok t;
    struct shardlm_err e;
    assert_int_equal(coord_tok_init(&t, buf, len, 512, "tok512.bin", &e), 0);
    const char *text = "caf\xc3\xa9 \xe2\x82\xac!";
    int32_t ids[64];
    int n = coord_tok_encode(&t, text, true, false, ids, 64);
    assert_true(n > 3);
    char out[64] = "";
    size_t ol = 0;
    for (int i = 1; i < n; i++) {
        size_t pl;
        const char *p = coord_tok_decode(&t, ids[i - 1], ids[i], &pl);
        memcpy(out + ol, p, pl);
        ol += pl;
    }
    out[ol] = 0;
    assert_string_equal(out, text);
    /* a lone control byte is not printed, a newline is, and so is a byte of a character */
    assert_false(coord_tok_printable("\x01", 1));
    assert_true(coord_tok_printable("\n", 1));
    assert_true(coord_tok_printable("\xe6", 1));
    coord_tok_free(&t);
    free(buf);
}

static void test_llama2_vocab(void **state)
{
    size_t len;
    uint8_t *buf = load("tokenizers/llama2-tokenizer.bin", &len, 1);
    struct coord_tok t;
    struct shardlm_err e;
    assert_int_equal(coord_tok_init(&t, buf, len, 32000, "llama2", &e), 0);
    int32_t ids[64];
    int n = coord_tok_encode(&t, "Hello world", true, false, ids, 64);
    /* Llama 2: BOS, "▁Hello" 15043, "▁world" 3186 */
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 15043);
    assert_int_equal(ids[2], 3186);
    coord_tok_free(&t);
    free(buf);
}

/* The llama2.c path through the general entry points: BOS as run.c adds it, the entry count of
 * a whole file, and C strings only. */
static void test_encode_ex(void **state)
{
    size_t len;
    uint8_t *buf = load("models/stories260K/tok512.bin", &len, 0);
    struct coord_tok t;
    struct shardlm_err e;
    assert_int_equal(coord_tok_llama2c_count(buf, len), 512);
    assert_int_equal(coord_tok_llama2c_count(buf, len - 1), -EINVAL);
    assert_int_equal(coord_tok_llama2c_count(buf, 3), -EINVAL);
    assert_int_equal(coord_tok_init(&t, buf, len, 512, "tok512.bin", &e), 0);
    assert_int_equal(t.type, COORD_TOK_SPM_LLAMA2C);
    int32_t a[64], b[64];
    int na = coord_tok_encode(&t, "Once upon a time", true, false, a, 64);
    int nb = coord_tok_encode_ex(&t, "Once upon a time", 16, COORD_TOK_ENC_ADD_SPECIAL, b, 64);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof(int32_t));
    assert_int_equal(coord_tok_encode_ex(&t, "a\0b", 3, 0, b, 64), -EILSEQ);
    size_t pl;
    coord_tok_decode(&t, 0, 512, &pl); /* out of range: empty */
    assert_int_equal(pl, 0);
    coord_tok_free(&t);
    free(buf);
}

static void test_hostile_files(void **state)
{
    size_t len;
    uint8_t *buf = load("models/stories260K/tok512.bin", &len, 0);
    struct coord_tok t;
    struct shardlm_err e;
    /* every truncation is an error, never a read past the end (ASan builds check that) */
    for (size_t cut = 0; cut < len; cut += (cut < 64 ? 1 : 97)) {
        uint8_t *c = malloc(cut ? cut : 1);
        memcpy(c, buf, cut);
        assert_int_equal(coord_tok_init(&t, c, cut, 512, "cut", &e), -EINVAL);
        free(c);
    }
    /* wrong vocabulary sizes */
    assert_int_equal(coord_tok_init(&t, buf, len, 511, "v", &e), -EINVAL);
    assert_non_null(strstr(e.msg, "wrong vocabulary size"));
    assert_int_equal(coord_tok_init(&t, buf, len, 1 << 22, "v", &e), -EINVAL);
    assert_int_equal(coord_tok_init(&t, buf, len, -3, "v", &e), -EINVAL);
    /* a token length past max_token_length or negative */
    uint8_t *c = malloc(len);
    memcpy(c, buf, len);
    int32_t bad = -5;
    memcpy(c + 8, &bad, 4);
    assert_int_equal(coord_tok_init(&t, c, len, 512, "neg", &e), -EINVAL);
    assert_non_null(strstr(e.msg, "token 0: length -5"));
    bad = 0x7fffffff;
    memcpy(c, &bad, 4);
    assert_int_equal(coord_tok_init(&t, c, len, 512, "maxlen", &e), -EINVAL);
    assert_non_null(strstr(e.msg, "max_token_length"));
    free(c);
    free(buf);
}

/* A tokenizer.json given where a llama2.c tokenizer.bin is expected is named as what it is, not
 * read as a max_token_length of 1702240891. */
static void test_other_format_as_llama2c(void **state)
{
    struct coord_tok t;
    struct shardlm_err e;
    static const char json[] = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}";
    assert_int_equal(coord_tok_init(&t, (const uint8_t *)json, sizeof(json) - 1, 512, "tok.json",
                                    &e),
                     -EINVAL);
    assert_non_null(strstr(e.msg, "tok.json: JSON (a tokenizer.json?), not a llama2.c"));
    static const uint8_t gguf[64] = "GGUF\3\0\0\0";
    assert_int_equal(coord_tok_init(&t, gguf, sizeof(gguf), 4, "m.gguf", &e), -EINVAL);
    assert_non_null(strstr(e.msg, "m.gguf: a GGUF file, not a llama2.c"));
    /* an unknown format keeps the field's message */
    static const uint8_t zero[64];
    assert_int_equal(coord_tok_init(&t, zero, sizeof(zero), 4, "z", &e), -EINVAL);
    assert_non_null(strstr(e.msg, "max_token_length is 0"));
}

/* A pre-tokenizer regex that backtracks past PCRE2's match limit: the encode fails saying so
 * and where, not "Invalid argument". */
static void test_regex_match_limit(void **state)
{
    static const char json[] =
        "{\"added_tokens\": [], \"normalizer\": null,"
        " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a+)+$\"},"
        " \"behavior\": \"Isolated\", \"invert\": false},"
        " \"post_processor\": null, \"decoder\": null,"
        " \"model\": {\"type\": \"BPE\", \"byte_fallback\": false, \"ignore_merges\": false,"
        " \"vocab\": {\"a\": 0, \"b\": 1, \"!\": 2, \"aa\": 3}, \"merges\": [\"a a\"]}}";
    struct coord_tok t;
    struct shardlm_err e;
    int rc = coord_tok_from_hf_json(&t, (const uint8_t *)json, sizeof(json) - 1, "re", &e);
    if (rc)
        fail_msg("%s", e.msg);
    int32_t ids[128];
    assert_int_equal(coord_tok_encode_err(&t, "aab", 3, 0, ids, 128, &e), 2); /* aa b */
    /* a byte that is not UTF-8 ends a run: the regex searches "ab", then from byte 3 */
    char text[64] = "ab\xff";
    memset(text + 3, 'a', 40);
    memcpy(text + 43, "!", 2);
    rc = coord_tok_encode_err(&t, text, 44, 0, ids, 128, &e);
    assert_int_equal(rc, -EINVAL);
    if (!strstr(e.msg, "regex 1 hit PCRE2's limit") || !strstr(e.msg, "from byte 3") ||
        !strstr(e.msg, "match limit"))
        fail_msg("%s", e.msg);
    /* the plain call fails the same way */
    assert_int_equal(coord_tok_encode_ex(&t, text, 44, 0, ids, 128), -EINVAL);
    coord_tok_free(&t);
}

/* Streams the NUL-separated pieces of @pieces (@n of them) through a coord_utf8 and checks
 * the text, the flush included, against @want. */
static void utf8_stream(const char *pieces, int n, const char *want)
{
    struct coord_utf8 u = {0};
    char out[256];
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(pieces);
        assert_true(o + 3 * l + 12 <= sizeof(out));
        o += coord_utf8_feed(&u, pieces, l, out + o);
        pieces += l + 1;
    }
    o += coord_utf8_flush(&u, out + o);
    assert_int_equal(coord_utf8_flush(&u, out + o), 0); /* nothing held twice */
    out[o] = 0;
    if (strcmp(out, want) != 0)
        fprintf(stderr, "got [%s] want [%s]\n", out, want);
    assert_string_equal(out, want);
}

#define FFFD "\xef\xbf\xbd"

/* Characters split over pieces are held back until whole; ill-formed bytes are U+FFFD. */
static void test_utf8_stream(void **state)
{
    struct coord_utf8 u = {0};
    char out[32];
    /* held back, then given whole */
    assert_int_equal(coord_utf8_feed(&u, "h\xc3", 2, out), 1);
    assert_int_equal(coord_utf8_feed(&u, "\xa9", 1, out), 2);
    assert_memory_equal(out, "\xc3\xa9", 2);
    utf8_stream("h\xc3\0\xa9llo", 2, "h\xc3\xa9llo");                      /* é over 2 */
    utf8_stream("\xe6\0\x97\0\xa5\xe6\x9c\0\xac", 4, "\xe6\x97\xa5\xe6\x9c\xac"); /* 日本 */
    utf8_stream("\xf0\0\x9f\x98\0\x80!", 3, "\xf0\x9f\x98\x80!");          /* 😀 over 3 */
    utf8_stream("\xf0\x9f\0\x98\x80", 2, "\xf0\x9f\x98\x80");
    utf8_stream("ascii \t\n", 1, "ascii \t\n");
    /* lone continuation bytes, bytes that never start a character */
    utf8_stream("a\x80\0b\xbf", 2, "a" FFFD "b" FFFD);
    utf8_stream("\xff\xfe\xf5", 1, FFFD FFFD FFFD);
    /* overlong forms, a surrogate, past U+10FFFF: one U+FFFD per byte that cannot go on */
    utf8_stream("\xc0\xaf", 1, FFFD FFFD);
    utf8_stream("\xe0\x80\xaf", 1, FFFD FFFD FFFD);
    utf8_stream("\xed\xa0\x80", 1, FFFD FFFD FFFD);
    utf8_stream("\xf4\x90\x80\x80", 1, FFFD FFFD FFFD FFFD);
    /* cut short by another character, by ASCII, by the end */
    utf8_stream("\xe6\x97\0\xe6\x97\xa5", 2, FFFD "\xe6\x97\xa5");
    utf8_stream("\xe6\x97\0a", 2, FFFD "a");
    utf8_stream("ok\xf0\x9f\x98", 1, "ok" FFFD);
    utf8_stream("\xc3", 1, FFFD);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_prompt_ids),
        cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_llama2_vocab),
        cmocka_unit_test(test_encode_ex),
        cmocka_unit_test(test_hostile_files),
        cmocka_unit_test(test_other_format_as_llama2c),
        cmocka_unit_test(test_regex_match_limit),
        cmocka_unit_test(test_utf8_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
