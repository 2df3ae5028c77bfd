/* SPDX-License-Identifier: MIT */
/* coordinator/tok: llama.cpp's tokenizer test vectors (tests/data/tokenizers: llama-spm,
 * phi-3, gpt-2), round trips, the blob (save/load, every truncation, byte flips), Hugging Face
 * tokenizer.json sources written here by hand, and malformed ones.
 *
 * The vectors: ggml-vocab-<name>.gguf.inp holds the inputs, each followed by a line
 * "__ggml_vocab_test__"; .out the expected ids of each, one line per input. llama.cpp's
 * test-tokenizer-0 makes them with common_tokenize(ctx, text, add_special = false,
 * parse_special = false): no BOS, and with SPM the dummy prefix all the same ("Hello world" is
 * "▁Hello ▁world", 15043 3186, the empty text no id at all). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "bench.h"
#include "gguf.h"
#include "shlm.h"
#include "testutil.h"
#include "tokenizer.h"
#include "util.h"

#define MAX_IDS 4096

struct vectors {
    char *inp, *out;   /* the files, cut in place */
    char *text[128];   /* inputs */
    int32_t *want[128]; /* expected ids */
    int n_want[128];
    int n;
};

static void vectors_load(struct vectors *v, const char *name)
{
    char p[4200];
    memset(v, 0, sizeof(*v));
    tu_path(p, sizeof(p), "%s/tokenizers/ggml-vocab-%s.gguf.inp", tu_data(), name);
    v->inp = tu_slurp(p, NULL);
    tu_path(p, sizeof(p), "%s/tokenizers/ggml-vocab-%s.gguf.out", tu_data(), name);
    v->out = tu_slurp(p, NULL);
    assert_non_null(v->inp);
    assert_non_null(v->out);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *c = v->inp, *o = v->out;
    for (char *s; (s = strstr(c, sep)); c = s + strlen(sep)) {
        assert_true(v->n < 128);
        *s = 0;
        char *nl = strchr(o, '\n');
        assert_non_null(nl);
        *nl = 0;
        v->text[v->n] = c;
        v->want[v->n] = malloc(MAX_IDS * sizeof(int32_t));
        int k = 0;
        for (char *q = o;;) {
            char *end;
            long id = strtol(q, &end, 10);
            if (end == q)
                break;
            v->want[v->n][k++] = (int32_t)id;
            q = end;
        }
        v->n_want[v->n++] = k;
        o = nl + 1;
    }
    assert_true(v->n > 40);
}

static void vectors_free(struct vectors *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->want[i]);
    free(v->inp);
    free(v->out);
}

/* Encodes every input; returns how many match, printing the first mismatches. */
static int vectors_run(const struct coord_tok *t, const struct vectors *v, const char *name)
{
    int32_t *got = malloc(MAX_IDS * sizeof(int32_t));
    int pass = 0, shown = 0;
    for (int i = 0; i < v->n; i++) {
        int n = coord_tok_encode_ex(t, v->text[i], strlen(v->text[i]), 0, got, MAX_IDS);
        if (n == v->n_want[i] && memcmp(got, v->want[i], (size_t)n * sizeof(int32_t)) == 0) {
            pass++;
        } else if (shown++ < 3) {
            fprintf(stderr, "%s: vector %d [%s]: got %d ids:", name, i, v->text[i], n);
            for (int k = 0; k < n && k < 40; k++)
                fprintf(stderr, " %d", got[k]);
            fprintf(stderr, "\n");
        }
    }
    free(got);
    return pass;
}

/* decode(encode(x)) == x, the pieces joined from the start (prev = -1). */
static void round_trip(const struct coord_tok *t, const char *text, size_t len, unsigned flags)
{
    int32_t *ids = malloc(MAX_IDS * sizeof(int32_t));
    int n = coord_tok_encode_ex(t, text, len, flags, ids, MAX_IDS);
    assert_true(n >= 0);
    char *out = malloc(len * 4 + 64);
    size_t ol = 0;
    for (int i = 0; i < n; i++) {
        size_t pl;
        const char *p = coord_tok_decode(t, i ? ids[i - 1] : -1, ids[i], &pl);
        assert_true(ol + pl <= len * 4 + 64);
        memcpy(out + ol, p, pl);
        ol += pl;
    }
    if (ol != len || memcmp(out, text, len) != 0)
        fprintf(stderr, "round trip of [%.*s] gave [%.*s]\n", (int)len, text, (int)ol, out);
    assert_int_equal(ol, len);
    assert_memory_equal(out, text, len);
    free(out);
    free(ids);
}

#define RT(t, lit, flags) round_trip((t), (lit), sizeof(lit) - 1, (flags))

static void open_gguf(const char *name, struct gguf_file *g, struct coord_tok *t)
{
    char p[4200];
    struct shardlm_err e;
    tu_path(p, sizeof(p), "%s/tokenizers/ggml-vocab-%s.gguf", tu_data(), name);
    int rc = gguf_open(g, p, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    rc = coord_tok_from_gguf(t, g, p, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
}

/* Every vector, every round trip, and the same through save/load. */
static void check_vocab(const char *name, int vocab_size, enum coord_tok_type type)
{
    struct gguf_file g;
    struct coord_tok t, u;
    struct shardlm_err e;
    struct vectors v;
    open_gguf(name, &g, &t);
    assert_int_equal(t.vocab_size, vocab_size);
    assert_int_equal(t.type, type);
    vectors_load(&v, name);
    int pass = vectors_run(&t, &v, name);
    fprintf(stderr, "%s: %d/%d vectors\n", name, pass, v.n);
    assert_int_equal(pass, v.n);
    for (int i = 0; i < v.n; i++)
        round_trip(&t, v.text[i], strlen(v.text[i]), 0);

    uint8_t *blob, *blob2;
    size_t len, len2;
    assert_int_equal(coord_tok_save(&t, &blob, &len), 0);
    assert_true(coord_tok_is_blob(blob, len));
    assert_int_equal(coord_tok_load(&u, blob, len, "blob", &e), 0);
    assert_int_equal(vectors_run(&u, &v, "blob"), v.n);
    assert_int_equal(u.bos_id, t.bos_id);
    assert_int_equal(u.eos_id, t.eos_id);
    assert_int_equal(u.flags, t.flags);
    assert_int_equal(coord_tok_save(&u, &blob2, &len2), 0);
    assert_int_equal(len2, len);
    assert_memory_equal(blob2, blob, len);
    coord_tok_free(&u);
    /* truncations of a large blob: spot checks (the small one of test_hf_byte_level has all) */
    for (size_t cut = 0; cut < len; cut += len / 97 + 1)
        assert_int_equal(coord_tok_load(&u, blob, cut, "cut", &e), -EINVAL);
    free(blob);
    free(blob2);
    vectors_free(&v);
    coord_tok_free(&t);
    gguf_close(&g);
}

static void test_llama_spm(void **state)
{
    check_vocab("llama-spm", 32000, COORD_TOK_SPM);
    struct gguf_file g;
    struct coord_tok t;
    open_gguf("llama-spm", &g, &t);
    int32_t ids[64];
    /* BOS as the source declares (add_bos_token true), the dummy prefix after it */
    assert_int_equal(coord_tok_encode_ex(&t, "Hello world", 11, COORD_TOK_ENC_ADD_SPECIAL, ids,
                                         64), 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043);
    assert_int_equal(ids[2], 3186);
    assert_int_equal(coord_tok_encode(&t, "Hello world", true, true, ids, 64), 4);
    assert_int_equal(ids[3], 2);
    /* text that spells a control token is text unless parse_special */
    int n = coord_tok_encode_ex(&t, "<s>x", 4, 0, ids, 64);
    assert_true(n > 1);
    for (int i = 0; i < n; i++)
        assert_int_not_equal(ids[i], 1);
    assert_int_equal(coord_tok_encode_ex(&t, "<s>Hello", 8, COORD_TOK_ENC_PARSE_SPECIAL, ids, 64),
                     2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043); /* the dummy prefix after a special token */
    RT(&t, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\t!", 0);
    /* a NUL in the text falls back to <0x00> */
    RT(&t, "a\0b", 0);
    /* too small a buffer */
    assert_int_equal(coord_tok_encode(&t, "Hello world", false, false, ids, 1), -ENOSPC);
    coord_tok_free(&t);
    gguf_close(&g);
}

static void test_phi3(void **state)
{
    check_vocab("phi-3", 32064, COORD_TOK_SPM);
    struct gguf_file g;
    struct coord_tok t;
    open_gguf("phi-3", &g, &t);
    int32_t ids[64];
    /* "</s>" is user-defined in this vocabulary: split out even without parse_special; Phi-3's
     * special tokens eat the spaces after them (llama.cpp's rstrip rule) */
    int n = coord_tok_encode_ex(&t, "Hi</s>  there", 13, 0, ids, 64);
    assert_true(n >= 3);
    assert_int_equal(ids[1], 2);
    int32_t ids2[64];
    assert_int_equal(coord_tok_encode_ex(&t, "Hi</s>there", 11, 0, ids2, 64), n);
    assert_memory_equal(ids, ids2, (size_t)n * sizeof(int32_t));
    /* control tokens only with parse_special */
    assert_int_equal(coord_tok_encode_ex(&t, "<|user|>", 8, COORD_TOK_ENC_PARSE_SPECIAL, ids, 64),
                     1);
    assert_int_equal(ids[0], 32010);
    assert_true(coord_tok_encode_ex(&t, "<|user|>", 8, 0, ids, 64) > 1);
    assert_int_equal(t.eos_id, 32000);
    /* the end of a generation: EOS (<|endoftext|>) and the end of a turn, <|end|> (32007) */
    int32_t eog[COORD_TOK_MAX_EOG];
    int ne = coord_tok_eog_ids(&t, eog);
    assert_int_equal(ne, 2);
    assert_int_equal(eog[0], 32000);
    assert_int_equal(eog[1], 32007);
    coord_tok_free(&t);
    gguf_close(&g);
}

static void test_gpt2(void **state)
{
    check_vocab("gpt-2", 50257, COORD_TOK_BPE);
    struct gguf_file g;
    struct coord_tok t;
    open_gguf("gpt-2", &g, &t);
    int32_t ids[64];
    /* no add_bos_token: nothing added; BOS on request is <|endoftext|> */
    assert_int_equal(coord_tok_encode_ex(&t, "Hello", 5, COORD_TOK_ENC_ADD_SPECIAL, ids, 64), 1);
    assert_int_equal(ids[0], 15496);
    assert_int_equal(coord_tok_encode(&t, "Hello", true, false, ids, 64), 2);
    assert_int_equal(ids[0], 50256);
    assert_int_equal(coord_tok_encode_ex(&t, "<|endoftext|>", 13, COORD_TOK_ENC_PARSE_SPECIAL,
                                         ids, 64), 1);
    assert_int_equal(ids[0], 50256);
    int n = coord_tok_encode_ex(&t, "<|endoftext|>", 13, 0, ids, 64);
    assert_true(n > 1);
    size_t pl;
    coord_tok_decode(&t, -1, 50256, &pl);
    assert_int_equal(pl, 0); /* control tokens decode to nothing */
    /* every byte value round-trips through the byte-level mapping */
    char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (char)i;
    round_trip(&t, all, 256, 0);
    RT(&t, "  x  \n\n\t y's 'RE 12345 \xe2\x82\xac\xe2\x82", 0);
    coord_tok_free(&t);
    gguf_close(&g);
}

/* The existing llama2.c path through the blob: same ids as tokenizer.bin. */
static void test_llama2c_blob(void **state)
{
    size_t len = 0;
    char p[4200];
    tu_path(p, sizeof(p), "%s/tokenizers/llama2-tokenizer.bin", tu_data());
    uint8_t *buf = (uint8_t *)tu_slurp(p, &len);
    assert_non_null(buf);
    assert_int_equal(coord_tok_llama2c_count(buf, len), 32000);
    assert_int_equal(coord_tok_llama2c_count(buf, len - 1), -EINVAL);
    struct coord_tok t, u;
    struct shardlm_err e;
    assert_int_equal(coord_tok_init(&t, buf, len, 32000, "llama2", &e), 0);
    uint8_t *blob;
    size_t bl;
    assert_int_equal(coord_tok_save(&t, &blob, &bl), 0);
    assert_int_equal(coord_tok_load(&u, blob, bl, "blob", &e), 0);
    assert_int_equal(u.type, COORD_TOK_SPM_LLAMA2C);
    const char *texts[] = {"Hello world", "caf\xc3\xa9 \xe2\x82\xac!", "Once upon a time", " x"};
    for (int i = 0; i < 4; i++) {
        int32_t a[64], b[64];
        int na = coord_tok_encode(&t, texts[i], true, false, a, 64);
        int nb = coord_tok_encode(&u, texts[i], true, false, b, 64);
        assert_true(na > 0);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, (size_t)na * sizeof(int32_t));
        for (int k = 1; k < na; k++) {
            size_t la, lb;
            const char *pa = coord_tok_decode(&t, a[k - 1], a[k], &la);
            const char *pb = coord_tok_decode(&u, b[k - 1], b[k], &lb);
            assert_int_equal(la, lb);
            assert_memory_equal(pa, pb, la);
        }
    }
    coord_tok_free(&u);
    coord_tok_free(&t);
    free(blob);
    free(buf);
}

/* A byte-level BPE of 29 tokens written by hand (GPT-2 style: Ġ = space, Ċ = newline). */
static const char tiny_bpe[] =
    "{\"version\": \"1.0\",\n"
    " \"added_tokens\": [\n"
    "  {\"id\": 0, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false,\n"
    "   \"rstrip\": false, \"normalized\": false, \"special\": true},\n"
    "  {\"id\": 28, \"content\": \"<tool>\", \"single_word\": false, \"lstrip\": false,\n"
    "   \"rstrip\": false, \"normalized\": false, \"special\": false}],\n"
    " \"normalizer\": null,\n"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,\n"
    "                   \"trim_offsets\": true, \"use_regex\": true},\n"
    " \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true},\n"
    " \"decoder\": {\"type\": \"ByteLevel\"},\n"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null,\n"
    "  \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false,\n"
    "  \"byte_fallback\": false,\n"
    "  \"vocab\": {\"<|endoftext|>\": 0, \"a\": 1, \"b\": 2, \"c\": 3, \"d\": 4, \"e\": 5,\n"
    "   \"h\": 6, \"l\": 7, \"o\": 8, \"r\": 9, \"w\": 10, \"\\u0120\": 11, \"!\": 12,\n"
    "   \"\\u010a\": 13, \"1\": 14, \"2\": 15, \"he\": 16, \"ll\": 17, \"hell\": 18,\n"
    "   \"hello\": 19, \"\\u0120w\": 20, \"or\": 21, \"\\u0120wor\": 22, \"\\u0120worl\": 23,\n"
    "   \"\\u0120world\": 24, \"ab\": 25, \"abc\": 26, \"12\": 27},\n"
    "  \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\", \"\\u0120 w\", [\"o\", \"r\"],\n"
    "             \"\\u0120w or\", \"\\u0120wor l\", \"\\u0120worl d\", \"a b\", \"ab c\",\n"
    "             \"1 2\"]}}\n";

static void expect_ids(const struct coord_tok *t, const char *text, unsigned flags, int n,
                       const int32_t *want)
{
    int32_t got[64];
    int g = coord_tok_encode_ex(t, text, strlen(text), flags, got, 64);
    if (g != n)
        fprintf(stderr, "[%s]: %d ids, expected %d\n", text, g, n);
    assert_int_equal(g, n);
    if (n > 0)
        assert_memory_equal(got, want, (size_t)n * sizeof(int32_t));
}

static void test_hf_byte_level(void **state)
{
    struct coord_tok t, u;
    struct shardlm_err e;
    int rc = coord_tok_from_hf_json(&t, (const uint8_t *)tiny_bpe, strlen(tiny_bpe), "tiny", &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(t.vocab_size, 29);
    assert_int_equal(t.type, COORD_TOK_BPE);
    assert_true(t.flags & COORD_TOKF_BYTE_LEVEL);
    assert_int_equal(t.bos_id, 0); /* <|endoftext|>, by name */
    assert_int_equal(t.eos_id, 0);
    /* "hello": he, ll, hell, hello; " world": Ġw, or, Ġwor, Ġworl, Ġworld */
    expect_ids(&t, "hello world", 0, 2, (int32_t[]){19, 24});
    expect_ids(&t, "hello!!", 0, 3, (int32_t[]){19, 12, 12}); /* "!!" has no merge */
    expect_ids(&t, "abc12", 0, 2, (int32_t[]){26, 27});      /* letters, then digits */
    expect_ids(&t, "cab", 0, 2, (int32_t[]){3, 25});
    expect_ids(&t, "lll", 0, 2, (int32_t[]){17, 7}); /* equal ranks: leftmost first */
    expect_ids(&t, "hello\n", 0, 2, (int32_t[]){19, 13});
    expect_ids(&t, " w", 0, 1, (int32_t[]){20});
    expect_ids(&t, "  w", 0, 2, (int32_t[]){11, 20}); /* "\s+(?!\S)" leaves the last space */
    expect_ids(&t, "<tool>hello", 0, 2, (int32_t[]){28, 19}); /* user-defined: always split */
    expect_ids(&t, "<|endoftext|>hello", COORD_TOK_ENC_PARSE_SPECIAL, 2, (int32_t[]){0, 19});
    expect_ids(&t, "hello", COORD_TOK_ENC_BOS | COORD_TOK_ENC_EOS, 3, (int32_t[]){0, 19, 0});
    expect_ids(&t, "", 0, 0, NULL);
    int32_t ids[8];
    assert_int_equal(coord_tok_encode(&t, "x", false, false, ids, 8), -EILSEQ);
    assert_int_equal(coord_tok_encode(&t, "<|endoftext|>", false, false, ids, 8), -EILSEQ);
    RT(&t, "hello world\n<tool>abc12 lll!", 0);
    size_t pl;
    const char *p = coord_tok_decode(&t, -1, 24, &pl);
    assert_int_equal(pl, 6);
    assert_memory_equal(p, " world", 6);
    /* the blob, and every truncation of it */
    uint8_t *blob;
    size_t bl;
    assert_int_equal(coord_tok_save(&t, &blob, &bl), 0);
    assert_int_equal(coord_tok_load(&u, blob, bl, "blob", &e), 0);
    expect_ids(&u, "hello world", 0, 2, (int32_t[]){19, 24});
    expect_ids(&u, "<tool>hello", 0, 2, (int32_t[]){28, 19});
    coord_tok_free(&u);
    for (size_t cut = 0; cut < bl; cut++) {
        uint8_t *c = malloc(cut ? cut : 1);
        memcpy(c, blob, cut);
        assert_int_equal(coord_tok_load(&u, c, cut, "cut", &e), -EINVAL);
        free(c);
    }
    free(blob);
    coord_tok_free(&t);
}

/* A Llama 2 style tokenizer.json: "▁" for spaces (Prepend + Replace normalizers), byte
 * fallback, BOS from the TemplateProcessing post-processor. */
static const char tiny_spm[] =
    "{\"added_tokens\": [\n"
    "  {\"id\": 0, \"content\": \"<unk>\", \"special\": true},\n"
    "  {\"id\": 1, \"content\": \"<s>\", \"special\": true},\n"
    "  {\"id\": 2, \"content\": \"</s>\", \"special\": true}],\n"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [\n"
    "   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},\n"
    "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},\n"
    " \"pre_tokenizer\": null,\n"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [\n"
    "   {\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},\n"
    "   {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {}},\n"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true,\n"
    "  \"fuse_unk\": true,\n"
    "  \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0x0A>\": 3, \"<0xC3>\": 4,\n"
    "   \"<0xA9>\": 5, \"\\u2581\": 6, \"a\": 7, \"b\": 8, \"\\u2581a\": 9, \"\\u2581ab\": 10},\n"
    "  \"merges\": [\"\\u2581 a\", \"\\u2581a b\"]}}\n";

static void test_hf_spm_style(void **state)
{
    struct coord_tok t;
    struct shardlm_err e;
    int rc = coord_tok_from_hf_json(&t, (const uint8_t *)tiny_spm, strlen(tiny_spm), "spm", &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(t.bos_id, 1);
    assert_int_equal(t.eos_id, 2);
    assert_int_equal(t.unk_id, 0);
    assert_true(t.flags & COORD_TOKF_ADD_BOS);
    assert_true(t.flags & COORD_TOKF_SPACE_PREFIX);
    assert_true(t.flags & COORD_TOKF_BYTE_FALLBACK);
    /* "▁ab▁a": both "▁ a" (rank 0), the left one first, then "▁a b" */
    expect_ids(&t, "ab a", 0, 2, (int32_t[]){10, 9});
    expect_ids(&t, "ab a", COORD_TOK_ENC_ADD_SPECIAL, 3, (int32_t[]){1, 10, 9});
    /* é is not a piece: its bytes; "\n" too */
    expect_ids(&t, "\xc3\xa9\n", 0, 4, (int32_t[]){6, 4, 5, 3});
    RT(&t, "ab a\xc3\xa9\n", 0);
    /* control tokens in the text, with parse_special: the prefix again after them */
    expect_ids(&t, "<s>a", COORD_TOK_ENC_PARSE_SPECIAL, 2, (int32_t[]){1, 9});
    size_t l0, l1;
    coord_tok_decode(&t, -1, 1, &l0); /* control tokens decode to nothing */
    const char *p = coord_tok_decode(&t, 1, 9, &l1);
    assert_int_equal(l0, 0);
    assert_int_equal(l1, 1);
    assert_memory_equal(p, "a", 1);
    p = coord_tok_decode(&t, 7, 9, &l1); /* within the text the space stays */
    assert_int_equal(l1, 2);
    assert_memory_equal(p, " a", 2);
    coord_tok_free(&t);

    /* Gemma style: no dummy prefix, and a split on ' ' that the normalizer made moot */
    const char *from = "{\"type\": \"Sequence\", \"normalizers\": [\n"
                       "   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},\n   ";
    const char *at = strstr(tiny_spm, from);
    assert_non_null(at);
    char *g = malloc(sizeof(tiny_spm) + 200);
    memcpy(g, tiny_spm, (size_t)(at - tiny_spm));
    strcpy(g + (at - tiny_spm), at + strlen(from));
    char *pre = strstr(g, "]},\n \"pre_tokenizer\": null");
    assert_non_null(pre);
    char *rest = strdup(pre + strlen("]},\n \"pre_tokenizer\": null"));
    strcpy(pre, ",\n \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
                "\"behavior\": \"MergedWithPrevious\", \"invert\": false}");
    strcat(g, rest);
    free(rest);
    rc = coord_tok_from_hf_json(&t, (const uint8_t *)g, strlen(g), "gemma", &e);
    if (rc)
        fprintf(stderr, "%s\n%s\n", e.msg, g);
    assert_int_equal(rc, 0);
    assert_false(t.flags & COORD_TOKF_SPACE_PREFIX);
    expect_ids(&t, "ab a", 0, 3, (int32_t[]){7, 8, 9});
    RT(&t, "ab a", 0);
    coord_tok_free(&t);
    free(g);
}

/* Malformed tokenizer.json files: one-line errors, never a crash. */
static void refused(const char *json, const char *needle)
{
    char dir[4096], path[4200];
    tu_mkdtemp(dir, sizeof(dir), "tokjson");
    tu_path(path, sizeof(path), "%s/tokenizer.json", dir);
    assert_int_equal(tu_write(path, json, strlen(json)), 0);
    size_t len = 0;
    char *buf = tu_slurp(path, &len);
    struct coord_tok t;
    struct shardlm_err e;
    int rc = coord_tok_from_hf_json(&t, (const uint8_t *)buf, len, path, &e);
    if (rc != -EINVAL || (needle && !strstr(e.msg, needle)))
        fprintf(stderr, "rc %d msg [%s], expected [%s]\n", rc, rc ? e.msg : "", needle);
    assert_int_equal(rc, -EINVAL);
    assert_null(strchr(e.msg, '\n'));
    if (needle)
        assert_non_null(strstr(e.msg, needle));
    free(buf);
    tu_rmdir(dir);
}

/* tiny_bpe with one substitution */
static char *tiny_with(const char *from, const char *to)
{
    const char *at = strstr(tiny_bpe, from);
    assert_non_null(at);
    char *s = malloc(sizeof(tiny_bpe) + strlen(to));
    size_t pre = (size_t)(at - tiny_bpe);
    memcpy(s, tiny_bpe, pre);
    strcpy(s + pre, to);
    strcat(s, at + strlen(from));
    return s;
}

static void refused_with(const char *from, const char *to, const char *needle)
{
    char *s = tiny_with(from, to);
    refused(s, needle);
    free(s);
}

static void test_hf_malformed(void **state)
{
    refused("", "not JSON");
    refused("[1, 2]", "top level");
    refused("{\"added_tokens\": []}", "model");
    refused("{\"model\": 3}", "model");
    refused("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", "model.vocab");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "0 tokens");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "model.merges");
    refused_with("\"a\": 1,", "\"a\": \"1\",", "integer ids");
    refused_with("\"a\": 1,", "\"a\": -1,", "id -1");
    refused_with("\"a\": 1,", "\"a\": 4000000000,", "id 4000000000");
    refused_with("\"a\": 1,", "\"a\": 99999999999999999999999,", "not JSON");
    refused_with("\"a\": 1,", "\"a\": 1e300,", "integer ids");
    refused_with("\"a\": 1,", "\"a\": 2,", "id 2 is both");
    refused_with("\"a\": 1,", "\"a\": 1, \"a\": 1,", "not JSON"); /* duplicate key */
    refused_with("\"h e\"", "\"h x\"", "'x' is not in the vocabulary");
    refused_with("\"1 2\"", "\"2 1\"", "concatenation is not in the vocabulary");
    refused_with("\"1 2\"", "\"12\"", "model.merges");
    refused_with("\"1 2\"", "3", "model.merges");
    refused_with("[\"o\", \"r\"]", "[\"o\"]", "model.merges");
    refused_with("\"dropout\": null", "\"dropout\": 0.1", "dropout");
    refused_with("\"byte_fallback\": false", "\"byte_fallback\": 1", "byte_fallback");
    refused_with("\"end_of_word_suffix\": null", "\"end_of_word_suffix\": \"</w>\"",
                 "end_of_word_suffix");
    refused_with("\"id\": 28,", "\"id\": 3,", "id 3 is both");
    refused_with("\"id\": 28,", "\"id\": \"28\",", "added_tokens");
    refused_with("\"id\": 28,", "\"id\": 1000000,", "id 1000000");
    refused_with("\"added_tokens\": [", "\"added_tokens\": 7, \"x\": [", "added_tokens");
    refused_with("{\"type\": \"ByteLevel\", \"add_prefix_space\": false,",
                 "{\"type\": \"Whitespace\", \"add_prefix_space\": false,", "Whitespace");
    refused_with("{\"type\": \"ByteLevel\", \"add_prefix_space\": false,",
                 "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": "
                 "\"Isolated\", \"invert\": false, \"x\": false,", "regex 0");
    refused_with("{\"type\": \"ByteLevel\", \"add_prefix_space\": false,",
                 "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
                 "\"Removed\", \"x\": false,", "behavior");
    refused_with("\"normalizer\": null", "\"normalizer\": {\"type\": \"Lowercase\"}", "Lowercase");
    refused_with("\"normalizer\": null", "\"normalizer\": 5", "normalizer");
    /* nested without end: jansson's depth limit */
    char *deep = malloc(100001);
    memset(deep, '[', 100000);
    deep[100000] = 0;
    refused(deep, "not JSON");
    free(deep);
}

/* Random byte flips in a small blob: a load either fails cleanly or gives a tokenizer that
 * encodes and decodes without fault (the checksum is patched, so the parser sees the flip). */
static void test_blob_flips(void **state)
{
    struct coord_tok t, u;
    struct shardlm_err e;
    assert_int_equal(coord_tok_from_hf_json(&t, (const uint8_t *)tiny_bpe, strlen(tiny_bpe),
                                            "tiny", &e), 0);
    uint8_t *blob;
    size_t bl;
    assert_int_equal(coord_tok_save(&t, &blob, &bl), 0);
    coord_tok_free(&t);
    uint8_t *c = malloc(bl);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int loaded = 0;
    for (int round = 0; round < 4000; round++) {
        memcpy(c, blob, bl);
        int flips = 1 + round % 4;
        for (int k = 0; k < flips; k++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            c[(seed >> 16) % (bl - 8)] ^= (uint8_t)(1u << (seed % 8));
        }
        if (memcmp(c, blob, bl) == 0) /* the flips cancelled out */
            continue;
        /* unpatched: the checksum refuses it */
        assert_int_equal(coord_tok_load(&u, c, bl, "flip", &e), -EINVAL);
        uint64_t h = shlm_fnv1a(SHLM_FNV_OFFSET, c, bl - 8);
        memcpy(c + bl - 8, &h, 8);
        if (coord_tok_load(&u, c, bl, "flip", &e) != 0)
            continue;
        loaded++;
        int32_t ids[128];
        const char *text = "hello world <tool>abc12 lll!\n\xff";
        int n = coord_tok_encode_ex(&u, text, strlen(text), COORD_TOK_ENC_PARSE_SPECIAL, ids, 128);
        assert_true(n >= 0 || n == -EILSEQ || n == -EINVAL || n == -ENOSPC);
        for (int i = 0; i < n; i++) {
            assert_true(ids[i] >= 0 && ids[i] < u.vocab_size);
            size_t pl;
            const char *p = coord_tok_decode(&u, i ? ids[i - 1] : -1, ids[i], &pl);
            volatile unsigned sink = 0;
            for (size_t j = 0; j < pl; j++)
                sink += (unsigned char)p[j];
            (void)sink;
        }
        coord_tok_free(&u);
    }
    fprintf(stderr, "byte flips: %d of 4000 blobs still loaded\n", loaded);
    free(c);
    free(blob);
}

/* Blobs written by an earlier build (the seeds of tests/fuzz/corpus/tokblob, as .shlm files
 * made then carry them) load as they are, checksum included, and save to the same bytes: the
 * format, and the FNV-1a that ends it (shlm_fnv1a()), must not change under them. */
static void test_blobs_made_before(void **state)
{
    static const char *const names[] = {"tiny-bytelevel", "llama2c-tok512",
                                         "llama3-split-bytelevel", "digits-string-split",
                                         "metaspace-first-split"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char p[4200];
        size_t len = 0, l2;
        tu_path(p, sizeof(p), "%s/tests/fuzz/corpus/tokblob/%s", tu_src(), names[i]);
        uint8_t *buf = (uint8_t *)tu_slurp(p, &len), *again;
        assert_non_null(buf);
        struct coord_tok t;
        struct shardlm_err e;
        int rc = coord_tok_load(&t, buf, len, names[i], &e);
        if (rc)
            fprintf(stderr, "%s\n", e.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(coord_tok_save(&t, &again, &l2), 0);
        assert_int_equal(l2, len);
        assert_memory_equal(again, buf, len);
        free(again);
        coord_tok_free(&t);
        free(buf);
    }
}

/* A llama2.c tokenizer.bin from the test data (@data) or the source tree. */
static void open_bin(const char *rel, int data, struct coord_tok *t)
{
    char p[4200];
    size_t len = 0;
    struct shardlm_err e;
    tu_path(p, sizeof(p), "%s/%s", data ? tu_data() : tu_src(), rel);
    uint8_t *buf = (uint8_t *)tu_slurp(p, &len);
    assert_non_null(buf);
    assert_int_equal(coord_tok_init(t, buf, len, coord_tok_llama2c_count(buf, len), p, &e), 0);
    free(buf);
}

/* Seconds of one encoding of @text[0, n), which must succeed. */
static double encode_secs(const struct coord_tok *t, const char *text, size_t n, int32_t *ids)
{
    uint64_t t0 = shardlm_now_ns();
    int k = coord_tok_encode_ex(t, text, n, COORD_TOK_ENC_BOS, ids, (int)n + 16);
    uint64_t t1 = shardlm_now_ns();
    assert_true(k > 0);
    return (double)(t1 - t0) / 1e9;
}

/* Near-linear: 8x the text takes under 24x as long (linear 8, quadratic 64: 8 KiB against
 * 32 KiB with a bound of 8x, linear 4 against quadratic 16, failed now and then under ASan on a
 * busy machine at x8.1). Each side is the fastest of up to 5 interleaved runs, so that a busy
 * machine slows both or neither; a run of over 0.5 s ends the runs (it decides, and a quadratic
 * encoder would take minutes). */
static void check_linear(const struct coord_tok *t, const char *name, const char *text)
{
    const size_t small = 8 << 10, large = 64 << 10;
    int32_t *ids = malloc((large + 16) * sizeof(int32_t));
    double ts = 1e9, tl = 1e9;
    for (int r = 0; r < 5 && (r == 0 || tl < 0.5); r++) {
        double a = encode_secs(t, text, small, ids), b = encode_secs(t, text, large, ids);
        ts = a < ts ? a : ts;
        tl = b < tl ? b : tl;
    }
    fprintf(stderr, "%s: 8 KiB %.2f ms, 64 KiB %.2f ms: x%.1f\n", name, ts * 1e3, tl * 1e3,
            tl / ts);
    assert_true(tl < 24 * ts);
    free(ids);
}

/* Every source's encoder on English text, llama2.c's first (it was quadratic: 120 KB took more
 * than 120 s); the llama2.c vocabulary through a blob too, as a .shlm may carry it. */
static void test_linear_time(void **state)
{
    char *text = malloc((64 << 10) + 1);
    coord_bench_text(text, 64 << 10);
    struct coord_tok t, u;
    struct shardlm_err e;
    struct gguf_file g;
    open_bin("tokenizers/llama2-tokenizer.bin", 1, &t);
    check_linear(&t, "llama2-tokenizer.bin", text);
    uint8_t *blob;
    size_t bl;
    assert_int_equal(coord_tok_save(&t, &blob, &bl), 0);
    assert_int_equal(coord_tok_load(&u, blob, bl, "blob", &e), 0);
    check_linear(&u, "llama2-tokenizer.bin blob", text);
    coord_tok_free(&u);
    coord_tok_free(&t);
    free(blob);
    open_bin("models/stories260K/tok512.bin", 0, &t);
    check_linear(&t, "tok512.bin", text);
    coord_tok_free(&t);
    static const char *const ggufs[] = {"llama-spm", "phi-3", "gpt-2"};
    for (int i = 0; i < 3; i++) {
        open_gguf(ggufs[i], &g, &t);
        check_linear(&t, ggufs[i], text);
        coord_tok_free(&t);
        gguf_close(&g);
    }
    free(text);
}

/* The Llama 2 vocabulary as llama2.c's tokenizer.bin (run.c's rules) and as GGUF (llama.cpp's):
 * the same ids for every llama.cpp test vector and for 200 KB of English text. */
static void test_llama2c_is_gguf(void **state)
{
    struct coord_tok a, b;
    struct gguf_file g;
    struct vectors v;
    open_bin("tokenizers/llama2-tokenizer.bin", 1, &a);
    open_gguf("llama-spm", &g, &b);
    vectors_load(&v, "llama-spm");
    const size_t n = 200 << 10;
    char *text = malloc(n + 1);
    coord_bench_text(text, n);
    int32_t *ia = malloc((n + 16) * sizeof(int32_t)), *ib = malloc((n + 16) * sizeof(int32_t));
    for (int i = 0; i <= v.n; i++) {
        const char *s = i < v.n ? v.text[i] : text;
        size_t l = strlen(s);
        int na = coord_tok_encode_ex(&a, s, l, COORD_TOK_ENC_BOS, ia, (int)n + 16);
        int nb = coord_tok_encode_ex(&b, s, l, COORD_TOK_ENC_BOS, ib, (int)n + 16);
        if (na != nb || memcmp(ia, ib, (size_t)(na > 0 ? na : 0) * sizeof(int32_t)) != 0)
            fprintf(stderr, "[%.60s]: %d ids from tokenizer.bin, %d from GGUF\n", s, na, nb);
        assert_true(na > 0);
        assert_int_equal(na, nb);
        assert_memory_equal(ia, ib, (size_t)na * sizeof(int32_t));
    }
    free(ia);
    free(ib);
    free(text);
    vectors_free(&v);
    coord_tok_free(&b);
    gguf_close(&g);
    coord_tok_free(&a);
}

/* `shardlm bench tokenizer`, called in process (its one line goes to this test's output). */
static void test_bench_tokenizer(void **state)
{
    char spm[4200];
    tu_path(spm, sizeof(spm), "%s/tokenizers/ggml-vocab-llama-spm.gguf", tu_data());
    char *ok[] = {"bench", "tokenizer", "--tokenizer", spm, "--mb", "0.05", "-r", "2", NULL};
    assert_int_equal(coord_cmd_bench(8, ok), 0);
    char *help[] = {"bench", "tokenizer", "--help", NULL};
    assert_int_equal(coord_cmd_bench(3, help), 0);
    char *mb[] = {"bench", "tokenizer", "--tokenizer", spm, "--mb", "0", NULL};
    assert_int_equal(coord_cmd_bench(6, mb), 2);
    char *none[] = {"bench", "tokenizer", NULL};
    assert_int_equal(coord_cmd_bench(2, none), 2);
    char *missing[] = {"bench", "tokenizer", "--tokenizer", "/nonexistent", NULL};
    assert_int_equal(coord_cmd_bench(4, missing), 1);
    /* the text is the same every time, and English */
    char x[201], y[201];
    coord_bench_text(x, 200);
    coord_bench_text(y, 200);
    assert_string_equal(x, y);
    assert_int_equal(strlen(x), 200);
    assert_non_null(strstr(x, " the "));
}

/* `shardlm generate` prints a prompt of characters that stories260K's 512 pieces spell with
 * byte tokens (<0xNN>) as it is: each character whole, none dropped. */
static void test_generate_utf8(void **state)
{
    char dir[4096], model[4200], env[4300];
    tu_mkdtemp(dir, sizeof(dir), "genutf8");
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    tu_path(env, sizeof(env), "SHARDLM_RUNTIME_DIR=%s/run", dir);
    assert_int_equal(tu_convert(model, "f32", NULL), 0);
    const char *prompt = "h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80";
    char *args[] = {"generate", "-m", model, "-p", (char *)prompt, "-n", "0", "--temp", "0", NULL};
    struct tu_run *r = malloc(sizeof(*r));
    tu_run_shardlm(r, env, args, NULL, 120, NULL, NULL);
    if (r->status)
        fprintf(stderr, "generate: %d %s", r->status, r->err);
    assert_int_equal(r->status, 0);
    char want[64];
    snprintf(want, sizeof(want), "%s\n", prompt);
    assert_string_equal(r->out, want);
    free(r);
    tu_rmdir(dir);
}

/* `shardlm tokenize` on each kind of source (skipped when the binary is not built). */
static void run_cli(struct tu_run *r, const char *const *args)
{
    char *argv[16] = {(char *)tu_bin(), "tokenize"};
    int n = 2;
    for (; args[n - 2] && n < 15; n++)
        argv[n] = (char *)args[n - 2];
    argv[n] = NULL;
    tu_run_cmd(r, argv, NULL, 60, NULL, NULL);
}

static void test_cli(void **state)
{
    if (access(tu_bin(), X_OK) != 0) /* ctest builds it first (add_dependencies) */
        fail_msg("%s: %s", tu_bin(), strerror(errno));
    char gpt2[4200], spm[4200], bin[4200], dir[4096], json[4200], blob[4200];
    tu_path(gpt2, sizeof(gpt2), "%s/tokenizers/ggml-vocab-gpt-2.gguf", tu_data());
    tu_path(spm, sizeof(spm), "%s/tokenizers/ggml-vocab-llama-spm.gguf", tu_data());
    tu_path(bin, sizeof(bin), "%s/tokenizers/llama2-tokenizer.bin", tu_data());
    tu_mkdtemp(dir, sizeof(dir), "tokcli");
    tu_path(json, sizeof(json), "%s/tokenizer.json", dir);
    tu_path(blob, sizeof(blob), "%s/tok.blob", dir);
    assert_int_equal(tu_write(json, tiny_bpe, strlen(tiny_bpe)), 0);
    struct coord_tok t;
    struct shardlm_err e;
    uint8_t *b;
    size_t bl;
    assert_int_equal(coord_tok_from_hf_json(&t, (const uint8_t *)tiny_bpe, strlen(tiny_bpe), "t",
                                            &e), 0);
    assert_int_equal(coord_tok_save(&t, &b, &bl), 0);
    assert_int_equal(tu_write(blob, b, bl), 0);
    free(b);
    coord_tok_free(&t);
    struct tu_run *r = malloc(sizeof(*r));
    static const struct {
        const char *args[8];
        int status;
        const char *out; /* exact stdout, or the start of stderr when status != 0 */
    } cases[] = {
        {{"--tokenizer", "G", " Hello World!", NULL}, 0, "18435 2159 0\n"},
        {{"--tokenizer", "G", "--decode", "18435", "2159", "0", NULL}, 0, " Hello World!\n"},
        {{"--tokenizer", "G", "--special", "--bos", "<|endoftext|>", NULL}, 0, "50256 50256\n"},
        {{"--tokenizer", "S", "Hello world", NULL}, 0, "15043 3186\n"},
        {{"--tokenizer", "S", "--bos", "Hello world", NULL}, 0, "1 15043 3186\n"},
        {{"--tokenizer", "S", "--add-special", "Hello world", NULL}, 0, "1 15043 3186\n"},
        {{"--tokenizer", "S", "--decode", "1", "15043", "3186", NULL}, 0, "Hello world\n"},
        {{"--tokenizer", "B", "--bos", "Hello world", NULL}, 0, "1 15043 3186\n"},
        {{"--tokenizer", "B", "--vocab-size", "32000", "Hello world", NULL}, 0, "15043 3186\n"},
        {{"--tokenizer", "J", "hello world", NULL}, 0, "19 24\n"},
        {{"--tokenizer", "K", "<tool>hello world", NULL}, 0, "28 19 24\n"},
        {{"--tokenizer", "K", "--decode", "28", "19", "24", NULL}, 0, "<tool>hello world\n"},
        {{"--tokenizer", "J", "xyz", NULL}, 1, "shardlm tokenize: cannot tokenize"},
        {{"--tokenizer", "B", "--vocab-size", "31999", "x", NULL}, 1, "shardlm tokenize: "},
        {{"--tokenizer", "G", "--decode", "50257", NULL}, 1, "shardlm tokenize: id '50257'"},
        {{"--tokenizer", "/nonexistent", "x", NULL}, 1, "shardlm tokenize: /nonexistent"},
        {{"--tokenizer", "G", "--decode", "x1", NULL},
         2,
         "shardlm tokenize: --decode: 'x1' is not"},
        {{"--tokenizer", "G", NULL}, 2, "shardlm tokenize: expected one TEXT"},
        {{"--tokenizer", "G", "a", "b", NULL}, 2, "shardlm tokenize: expected one TEXT"},
        {{"--tokenizer", "G", "--decode", NULL}, 2, "shardlm tokenize: --decode needs"},
        {{"x", NULL}, 2, "shardlm tokenize: --tokenizer FILE is required"},
        {{"--vocab-size", "0", NULL}, 2, "shardlm tokenize: --vocab-size"},
        {{"--bogus", NULL}, 2, ""},
        {{"--help", NULL}, 0, "usage: shardlm tokenize"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *args[8];
        for (int k = 0; k < 8; k++) {
            const char *a = cases[i].args[k];
            args[k] = !a ? NULL : !strcmp(a, "G") ? gpt2 : !strcmp(a, "S") ? spm
                    : !strcmp(a, "B") ? bin : !strcmp(a, "J") ? json : !strcmp(a, "K") ? blob : a;
            if (!a)
                break;
        }
        run_cli(r, args);
        if (r->status != cases[i].status)
            fprintf(stderr, "case %zu: status %d, stdout [%s] stderr [%s]\n", i, r->status,
                    r->out, r->err);
        assert_int_equal(r->status, cases[i].status);
        if (cases[i].status == 0 && i + 1 < sizeof(cases) / sizeof(cases[0]))
            assert_string_equal(r->out, cases[i].out);
        else if (cases[i].status == 0)
            assert_memory_equal(r->out, cases[i].out, strlen(cases[i].out));
        else
            assert_memory_equal(r->err, cases[i].out, strlen(cases[i].out));
        /* an error is one line before the usage text */
        if (cases[i].status == 1)
            assert_ptr_equal(strchr(r->err, '\n'), r->err + r->err_len - 1);
    }
    free(r);
    tu_rmdir(dir);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_spm),     cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_gpt2),          cmocka_unit_test(test_llama2c_blob),
        cmocka_unit_test(test_hf_byte_level), cmocka_unit_test(test_hf_spm_style),
        cmocka_unit_test(test_hf_malformed),  cmocka_unit_test(test_blob_flips),
        cmocka_unit_test(test_cli),           cmocka_unit_test(test_linear_time),
        cmocka_unit_test(test_llama2c_is_gguf), cmocka_unit_test(test_bench_tokenizer),
        cmocka_unit_test(test_generate_utf8), cmocka_unit_test(test_blobs_made_before),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
