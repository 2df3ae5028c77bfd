/* SPDX-License-Identifier: MIT */
/* Tests of the Jinja interpreter (coordinator/chat/jinja*.c) and the chat layer (chat.c): what
 * the byte-for-byte comparison against Jinja2 (tests/test_chat_templates.sh) cannot show - the
 * limits a hostile template meets, errors with their line, Python's number formatting, the
 * messages a request may carry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "jinja.h"
#include "jinja_internal.h"

/* Renders @src with the JSON object @vars; returns the rc, the output (or the error) in @out. */
static int render(const char *src, const char *vars, const struct coord_jinja_limits *lim,
                  char *out, size_t len)
{
    struct coord_jinja *t;
    char why[300];
    int rc = coord_jinja_parse(src, strlen(src), &t, why, sizeof(why));
    if (rc) {
        snprintf(out, len, "%s", why);
        return rc;
    }
    json_t *v = vars ? json_loads(vars, 0, NULL) : NULL;
    char *r;
    size_t n;
    rc = coord_jinja_render(t, v, lim, &r, &n, why, sizeof(why));
    if (rc == 0) {
        snprintf(out, len, "%s", r);
        assert_int_equal(strlen(r), n);
        free(r);
    } else {
        snprintf(out, len, "%s", why);
    }
    json_decref(v);
    coord_jinja_free(t);
    return rc;
}

static void expect(const char *src, const char *vars, const char *want)
{
    char out[4096];
    int rc = render(src, vars, NULL, out, sizeof(out));
    if (rc)
        fail_msg("%s: %s", src, out);
    assert_string_equal(out, want);
}

/* Python's str() of numbers and containers, as Jinja2 prints them */
static void test_python_values(void **state)
{
    (void)state;
    expect("{{ 1.0 }} {{ 0.1 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ -2.5 }}", NULL,
           "1.0 0.1 1e+16 1000000000000000.0 1.5e-05 0.0001 -2.5");
    expect("{{ 1/3 }} {{ 2**62 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 5 / 2 }}", NULL,
           "0.3333333333333333 4611686018427387904 -4 2 2.5");
    expect("{{ [1, 'a', \"it's\", none, true, (1,), {'k': 2.0}] }}", NULL,
           "[1, 'a', \"it's\", None, True, (1,), {'k': 2.0}]");
    expect("{{ x | tojson }} {{ x | tojson(indent=2) }}", "{\"x\": {\"a\": [1, \"\\u00e9\"]}}",
           "{\"a\": [1, \"\xc3\xa9\"]} {\n  \"a\": [\n    1,\n    \"\xc3\xa9\"\n  ]\n}");
}

/* Jinja2's whitespace rules with trim_blocks and lstrip_blocks */
static void test_whitespace(void **state)
{
    (void)state;
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", NULL, "a\n  b\nc");
    expect("a  {%- if true -%}  b  {%- endif %}", NULL, "ab");
    expect("  {%+ if true %}x{% endif %}", NULL, "  x");
    expect("{# c #}\nx{{ 1 }}\ny", NULL, "x1\ny");
    expect("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
    expect("a\r\nb\r\n", NULL, "a\nb");
}

static void test_errors(void **state)
{
    (void)state;
    char out[512];
    assert_int_equal(render("a\n{% if x %}\nb", NULL, NULL, out, sizeof(out)), -EINVAL);
    assert_string_equal(out, "line 3: the template ends before {% endif %}");
    assert_int_equal(render("{% include 'x' %}", NULL, NULL, out, sizeof(out)), -EINVAL);
    assert_non_null(strstr(out, "unsupported tag 'include'"));
    assert_int_equal(render("\n{{ x.y }}", NULL, NULL, out, sizeof(out)), -EINVAL);
    assert_string_equal(out, "line 2: 'x' is undefined");
    assert_int_equal(
        render("{{ raise_exception('Roles must alternate') }}", NULL, NULL, out, sizeof(out)),
        -EINVAL);
    assert_string_equal(out, "Roles must alternate");
    assert_int_equal(render("{{ l.append(1) }}", "{\"l\": []}", NULL, out, sizeof(out)), -EINVAL);
    assert_non_null(strstr(out, "unsafe"));
    assert_int_equal(render("{{ 'a' + 1 }}", NULL, NULL, out, sizeof(out)), -EINVAL);
    assert_int_equal(render("{{ 1 // 0 }}", NULL, NULL, out, sizeof(out)), -EINVAL);
    assert_int_equal(render("{{ 9223372036854775807 + 1 }}", NULL, NULL, out, sizeof(out)),
                     -EINVAL);
    assert_int_equal(render("x\0y", NULL, NULL, out, sizeof(out)), 0); /* strlen stops at NUL */
}

/* A hostile template ends with -E2BIG at each limit, quickly and without a crash. */
static void test_limits(void **state)
{
    (void)state;
    char out[512];
    static const struct coord_jinja_limits small = {
        .max_output = 1000, .max_memory = 8 << 20, .max_steps = 100000, .max_depth = 8};
    assert_int_equal(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &small,
                            out, sizeof(out)),
                     -E2BIG);
    assert_non_null(strstr(out, "macro calls nested deeper than 8"));
    assert_int_equal(
        render("{% for i in range(2000) %}xxxxxxxxxx{% endfor %}", NULL, &small, out, sizeof(out)),
        -E2BIG);
    assert_non_null(strstr(out, "output passed 1000 bytes"));
    assert_int_equal(render("{{ 'x' * 100000 }}", NULL, &small, out, sizeof(out)), -E2BIG);
    assert_int_equal(render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}"
                            "{% endfor %}",
                            NULL, &small, out, sizeof(out)),
                     -E2BIG);
    assert_non_null(strstr(out, "steps"));
    assert_int_equal(render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}"
                            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
                            NULL, &small, out, sizeof(out)),
                     -E2BIG);
    assert_int_equal(render("{{ range(1000000) | length }}", NULL, NULL, out, sizeof(out)), -E2BIG);
    /* a namespace that holds itself, data nested in a loop: printing and comparing stop */
    assert_int_equal(render("{% set ns = namespace() %}{% set ns.x = ns %}{{ ns }}", NULL, NULL,
                            out, sizeof(out)),
                     -E2BIG);
    assert_int_equal(render("{% set ns = namespace(x=1) %}{% for i in range(1000) %}"
                            "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x == ns.x }}",
                            NULL, NULL, out, sizeof(out)),
                     -E2BIG);
    /* repeating nothing a huge number of times is nothing, at once */
    assert_int_equal(render("{{ '' * 9223372036854775807 }}|{{ ([] * 9223372036854775807) | "
                            "length }}",
                            NULL, NULL, out, sizeof(out)),
                     0);
    assert_string_equal(out, "|0");
    /* long number literals: 63 digits and an exponent read as Python reads them; past 255
     * characters, a clear error */
    char num[400] = "{{ ";
    memset(num + 3, '1', 63);
    strcpy(num + 66, "e+1 }}");
    expect(num, NULL, "1.1111111111111112e+63");
    memset(num + 3, '1', 300);
    strcpy(num + 303, " }}");
    assert_int_equal(render(num, NULL, NULL, out, sizeof(out)), -EINVAL);
    assert_string_equal(out, "line 1: a number literal longer than 255 characters");
    /* a left-leaning chain is as deep as its operators: 1+1+...+1 */
    size_t terms = 20000;
    char *sum = malloc(terms * 2 + 16);
    strcpy(sum, "{{ 1");
    for (size_t i = 1; i < terms; i++)
        memcpy(sum + 2 + 2 * i, "+1", 3);
    strcat(sum, " }}");
    assert_int_equal(render(sum, NULL, NULL, out, sizeof(out)), -E2BIG);
    free(sum);
    /* an error message is one line, as Python's " ".join(msg.splitlines()) */
    assert_int_equal(render("{{ raise_exception('a\nb\r\nc\n') }}", NULL, NULL, out, sizeof(out)),
                     -EINVAL);
    assert_string_equal(out, "a b c");
    assert_int_equal(render("x\xff", NULL, NULL, out, sizeof(out)), -EINVAL);
    assert_string_equal(out, "the template is not UTF-8 text");
    /* nesting: the parser's depth, not the stack */
    size_t n = 20000;
    char *deep = malloc(n + 16);
    memcpy(deep, "{{ ", 3);
    memset(deep + 3, '-', n);
    strcpy(deep + 3 + n, "1 }}");
    assert_int_equal(render(deep, NULL, NULL, out, sizeof(out)), -E2BIG);
    free(deep);
}

/* the chat layer: content parts joined, malformed messages refused as the request's fault */
static void test_chat_messages(void **state)
{
    (void)state;
    struct coord_chat_tmpl t;
    char why[300];
    const char *src = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                      "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    assert_int_equal(coord_chat_tmpl_init(&t, src, strlen(src), "<s>", "</s>", why, sizeof(why)),
                     0);
    json_t *req = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                             "\"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}, "
                             "{\"role\": \"assistant\", \"content\": null}]}",
                             0, NULL);
    char *out;
    size_t len;
    bool bad;
    assert_int_equal(coord_chat_render_request(&t, req, &out, &len, &bad, why, sizeof(why)), 0);
    assert_string_equal(out, "<s><user>a\nb<assistant>None<assistant>");
    free(out);
    json_decref(req);
    static const char *const refused[] = {
        "{\"messages\": []}",
        "{\"messages\": [{\"content\": \"x\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": 1}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": 2}",
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(*refused); i++) {
        req = json_loads(refused[i], 0, NULL);
        assert_int_equal(coord_chat_render_request(&t, req, &out, &len, &bad, why, sizeof(why)),
                         -EINVAL);
        assert_true(bad);
        json_decref(req);
    }
    /* kwargs are variables, but cannot replace the messages */
    const char *src2 = "{{ flag }} {{ messages | length }}";
    struct coord_chat_tmpl t2;
    assert_int_equal(coord_chat_tmpl_init(&t2, src2, strlen(src2), NULL, NULL, why, sizeof(why)),
                     0);
    req = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                     "\"chat_template_kwargs\": {\"flag\": false, \"messages\": []}}",
                     0, NULL);
    assert_int_equal(coord_chat_render_request(&t2, req, &out, &len, &bad, why, sizeof(why)), 0);
    assert_string_equal(out, "False 1");
    free(out);
    json_decref(req);
    coord_chat_tmpl_free(&t2);
    coord_chat_tmpl_free(&t);
}

/* The tables of filters, tests and methods: sorted by name (the lookup is a binary search), each
 * entry found under its name, a message wherever arguments are required; and the one arity
 * check's messages, as they were before the tables. */
static void test_tables(void **state)
{
    (void)state;
    static const struct {
        const struct jinja_fn *t;
        const size_t *n;
    } tables[] = {{jinja_filters, &jinja_nfilters},
                  {jinja_tests, &jinja_ntests},
                  {jinja_str_methods, &jinja_nstr_methods},
                  {jinja_dict_methods, &jinja_ndict_methods},
                  {jinja_list_methods, &jinja_nlist_methods}};
    for (size_t k = 0; k < sizeof(tables) / sizeof(*tables); k++) {
        const struct jinja_fn *t = tables[k].t;
        for (size_t i = 0; i < *tables[k].n; i++) {
            if (i)
                assert_true(strcmp(t[i - 1].name, t[i].name) < 0);
            assert_ptr_equal(jinja_lookup(t, *tables[k].n, t[i].name), &t[i]);
            assert_true((t[i].min_args > 0) == (t[i].too_few != NULL));
        }
        assert_null(jinja_lookup(t, *tables[k].n, "no such name"));
    }
    static const char *const cases[][2] = {
        {"{{ 'a'.startswith() }}", "line 1: startswith() takes at least 1 argument"},
        {"{{ 'a'.find(sub='a') }}", "line 1: find() takes at least 1 argument"},
        {"{{ 'a'.replace('a') }}", "line 1: replace() takes at least 2 arguments"},
        {"{{ ','.join() }}", "line 1: join() takes exactly one argument"},
        {"{{ {}.get() }}", "line 1: get expected at least 1 argument"},
        {"{{ 1 is eq }}", "line 1: test eq: expected a value to compare with"},
        {"{{ 1 is in }}", "line 1: test in: expected a container"},
        {"{{ 1 | attr }}", "line 1: attr: expected a name"},
        {"{{ 1 | nosuch }}", "line 1: no filter named 'nosuch'"},
        {"{{ 1 is nosuch }}", "line 1: no test named 'nosuch'"},
        {"{{ 'a'.upper == 'a'.upper }} {{ {}.keys == {}.keys }}", "False False"},
        {"{% set d = {} %}{{ d.keys == d.keys }} {{ d.keys == d.items }}", "True False"},
        {"{{ (2 ** 3 // 3 % 2 - -1 + +1) ~ (not 0) }}", "2True"},
        {"{{ -'a' }}", "line 1: bad operand type for unary -: 'str'"},
        {"{{ [] // 2 }}", "line 1: unsupported operand type(s) for //: 'list' and 'int'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        char out[300];
        render(cases[i][0], NULL, NULL, out, sizeof(out));
        assert_string_equal(out, cases[i][1]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_values), cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_errors),        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_chat_messages), cmocka_unit_test(test_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
