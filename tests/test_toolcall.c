/* SPDX-License-Identifier: MIT */
/* Tool-call and reasoning formats (coordinator/chat/toolcall.c): each real chat template of
 * tests/data/chat-templates gives its family; answers in each family's syntax split into
 * reasoning, content and calls; a call of an undeclared tool or malformed JSON stays content;
 * and every partial parse of every prefix of an answer gives fields that are prefixes of the
 * whole answer's (what a stream sends is never taken back). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "toolcall.h"

static const char tools_json[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"add\"}}]";

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

static void test_detect(void **state)
{
    (void)state;
    static const struct {
        const char *file, *format;
    } cases[] = {
        {"Qwen-Qwen3-0.6B.jinja", "hermes"},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3"},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3"},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek"},
        {"ibm-granite-granite-3.3-2B-Instruct.jinja", "granite"},
        {"openai-gpt-oss-120b.jinja", "gpt-oss"},
        {"google-gemma-2-2b-it.jinja", "generic (hermes)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/chat-templates/%s", tu_data(), cases[i].file);
        char *t = read_text(path);
        const struct coord_tool_format *f = coord_tool_format_of(t);
        if (strcmp(f->name, cases[i].format))
            fail_msg("%s: format %s, expected %s", cases[i].file, f->name, cases[i].format);
        free(t);
    }
    assert_string_equal(coord_tool_format_of(NULL)->name, "generic (hermes)");
}

/* The parse of @text by the family of template @tmpl, whole; and every prefix's partial parse
 * checked against it - its calls too unless @broken (a call whose JSON breaks late was a call
 * until then: only a grammar, which keeps a begun call valid, makes streamed calls final). */
static void parse_checked(const char *tmpl, const char *text, bool in_think, bool broken,
                          struct coord_reply *r)
{
    const struct coord_tool_format *f = coord_tool_format_of(tmpl);
    json_t *tools = json_loads(tools_json, 0, NULL);
    assert_non_null(tools);
    size_t n = strlen(text);
    assert_int_equal(coord_reply_parse(f, text, n, tools, true, in_think, false, r), 0);
    for (size_t k = 0; k <= n; k++) {
        struct coord_reply p;
        assert_int_equal(coord_reply_parse(f, text, k, tools, true, in_think, true, &p), 0);
        if (p.reasoning_len > r->reasoning_len ||
            (p.reasoning_len && memcmp(p.reasoning, r->reasoning, p.reasoning_len)))
            fail_msg("%s: prefix %zu: reasoning \"%s\" is not a prefix", f->name, k, p.reasoning);
        if (p.content_len > r->content_len ||
            (p.content_len && memcmp(p.content, r->content, p.content_len)))
            fail_msg("%s: prefix %zu: content \"%s\" is not a prefix", f->name, k, p.content);
        if (broken) {
            coord_reply_free(&p);
            continue;
        }
        if (p.n_calls > r->n_calls)
            fail_msg("%s: prefix %zu: %d calls, the whole has %d", f->name, k, p.n_calls,
                     r->n_calls);
        for (int i = 0; i < p.n_calls; i++) {
            const struct coord_call *a = &p.calls[i], *b = &r->calls[i];
            if (strcmp(a->name, b->name) || a->args_len > b->args_len ||
                memcmp(a->args, b->args, a->args_len))
                fail_msg("%s: prefix %zu: call %d %s(%s) is not a prefix of %s(%s)", f->name, k, i,
                         a->name, a->args, b->name, b->args);
        }
        coord_reply_free(&p);
    }
    json_decref(tools);
}

static void expect(const struct coord_reply *r, const char *reasoning, const char *content,
                   int n_calls, ...)
{
    assert_string_equal(r->reasoning ? r->reasoning : "", reasoning);
    assert_string_equal(r->content ? r->content : "", content);
    assert_int_equal(r->n_calls, n_calls);
    va_list ap;
    va_start(ap, n_calls);
    for (int i = 0; i < n_calls; i++) {
        assert_string_equal(r->calls[i].name, va_arg(ap, const char *));
        assert_string_equal(r->calls[i].args, va_arg(ap, const char *));
        assert_true(r->calls[i].done);
    }
    va_end(ap);
}

static void test_families(void **state)
{
    (void)state;
    struct coord_reply r;
    /* Hermes / Qwen3: reasoning, text, two calls, whitespace anywhere JSON has it */
    parse_checked(
        "<tool_call><think>",
        "<think>\nWhich tool? </thi\n</think>\n\nLet me look.\n<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
        "<tool_call>\n{ \"arguments\" : {\"a\": 1}, \"name\" : \"add\" }\n</tool_call>",
        false, false, &r);
    expect(&r, "\nWhich tool? </thi\n", "Let me look.\n", 2, "get_weather", "{\"city\": \"Paris\"}",
           "add", "{\"a\": 1}");
    coord_reply_free(&r);
    /* the prompt opened the reasoning */
    parse_checked("<tool_call><think>", "so: 4</think>\n\nFour.", true, false, &r);
    expect(&r, "so: 4", "Four.", 0);
    coord_reply_free(&r);
    /* an undeclared tool and broken JSON stay text */
    parse_checked("<tool_call>", "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>",
                  false, true, &r);
    expect(&r, "", "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>", 0);
    coord_reply_free(&r);
    parse_checked("<tool_call>", "Hi <tool_call>\n{\"name\": \"add\", \"arguments\": {]}", false,
                  true, &r);
    expect(&r, "", "Hi <tool_call>\n{\"name\": \"add\", \"arguments\": {]}", 0);
    coord_reply_free(&r);
    /* Llama 3.x: the answer is the JSON object, "parameters" */
    parse_checked("<|start_header_id|>\"parameters\"",
                  "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}",
                  false, false, &r);
    expect(&r, "", "", 1, "get_weather", "{\"city\": \"Oslo\", \"days\": 2}");
    coord_reply_free(&r);
    /* Mistral: [TOOL_CALLS] and a JSON list */
    parse_checked("[TOOL_CALLS]",
                  "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}}, {\"name\": "
                  "\"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
                  false, false, &r);
    expect(&r, "", "", 2, "add", "{\"a\": 1}", "get_weather", "{\"city\": \"Rome\"}");
    coord_reply_free(&r);
    /* DeepSeek V3 / R1: name after the separator, arguments in a json fence */
    parse_checked("<｜tool▁calls▁begin｜><think>",
                  "<think>\nok\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                  "<｜tool▁sep｜>add\n```json\n{\"a\": 2}\n```<｜tool▁call▁end｜>\n"
                  "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{}\n```"
                  "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                  false, false, &r);
    expect(&r, "\nok\n", "", 2, "add", "{\"a\": 2}", "get_weather", "{}");
    coord_reply_free(&r);
    /* Granite */
    parse_checked("<|tool_call|>", "<|tool_call|>[{\"name\": \"add\", \"arguments\": {\"a\": 3}}]",
                  false, false, &r);
    expect(&r, "", "", 1, "add", "{\"a\": 3}");
    coord_reply_free(&r);
    /* Qwen3-Coder: XML arguments, typed by the tool's schema */
    parse_checked("<tool_call><parameter=",
                  "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
                  "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                  false, false, &r);
    expect(&r, "", "", 1, "get_weather", "{\"city\":\"New York\",\"days\":3}");
    coord_reply_free(&r);
    /* gpt-oss: the analysis channel, a call in either place of its recipient, the final answer */
    parse_checked("<|channel|>",
                  "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
                  "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                  "{\"city\":\"Lima\"}",
                  false, false, &r);
    expect(&r, "Need weather.", "", 1, "get_weather", "{\"city\":\"Lima\"}");
    coord_reply_free(&r);
    parse_checked("<|channel|>", " to=functions.add<|channel|>commentary json<|message|>{\"a\": 5}",
                  false, false, &r);
    expect(&r, "", "", 1, "add", "{\"a\": 5}");
    coord_reply_free(&r);
    parse_checked("<|channel|>",
                  "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
                  "<|message|>Two.",
                  false, false, &r);
    expect(&r, "Easy.", "Two.", 0);
    coord_reply_free(&r);
    /* no tools given: a call's text is content */
    const struct coord_tool_format *h = coord_tool_format_of("<tool_call>");
    const char *t = "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>";
    assert_int_equal(coord_reply_parse(h, t, strlen(t), NULL, true, false, false, &r), 0);
    expect(&r, "", t, 0);
    coord_reply_free(&r);
    /* cut inside a call (max_tokens): the call, not done */
    json_t *tools = json_loads(tools_json, 0, NULL);
    t = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 12";
    assert_int_equal(coord_reply_parse(h, t, strlen(t), tools, true, false, false, &r), 0);
    assert_int_equal(r.n_calls, 1);
    assert_false(r.calls[0].done);
    assert_string_equal(r.calls[0].args, "{\"a\": 12");
    coord_reply_free(&r);
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
