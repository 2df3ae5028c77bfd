/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja.h: a small sandboxed Jinja interpreter - what the chat templates of
 * instruct models use, rendered as Hugging Face transformers renders them (Jinja2's
 * ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls; a tojson that
 * keeps non-ASCII; raise_exception and strftime_now).
 *
 * Covered: text with whitespace control ({%- -%}, {%+), comments, raw; {{ }}; if/elif/else; for
 * (tuple targets, an if filter, else, loop.*, break/continue); set (names, tuples, namespace
 * attributes, set blocks); macro; filter blocks; expressions with Python's operators, slicing,
 * literals, calls, filters and tests; the str / list / dict methods a sandbox allows. Values are
 * Python's (str() and repr() of numbers, lists and dicts included). Not covered: extends,
 * include, import, block, call, with: a syntax error names them. Approximate outside ASCII:
 * case mappings (upper, title...) change ASCII letters only, and wordcount's idea of a word
 * character follows Unicode blocks, not categories.
 *
 * A template cannot take more than its limits: output bytes, memory, evaluation steps (each
 * node, loop iteration, and byte or element an operation touches) and nesting depth; passing
 * one ends the render with an error. The files: jinja_lex.c (lexer), jinja_parse.c (parser),
 * jinja_eval.c (expressions, statements, the API), jinja_value.c (the arena, values),
 * jinja_filters.c, jinja_tests.c and jinja_methods.c (tables of filters, tests and methods,
 * and the globals), jinja_text.c (their string helpers, tojson); jinja_internal.h is what they
 * share. */
#ifndef SHARDLM_COORD_JINJA_H
#define SHARDLM_COORD_JINJA_H

#include <jansson.h>
#include <stddef.h>

struct coord_jinja; /* a parsed template */

struct coord_jinja_limits {
    size_t max_output; /* bytes of the rendering */
    size_t max_memory; /* bytes the render may allocate */
    long max_steps;    /* evaluation steps */
    int max_depth;     /* nested macro calls and expressions */
};
/* 8 MiB output, 64 MiB memory, 10 M steps (a few seconds at most), 32 nested macro calls. */
extern const struct coord_jinja_limits coord_jinja_default_limits;

/* Parses the template @src (@len bytes of UTF-8). Returns 0 and *@out, or -EINVAL with a
 * one-line message in @err ("line N: ..."), -E2BIG for a template past 1 MiB or nested past the
 * depth limit, -ENOMEM. Release with coord_jinja_free(). */
int coord_jinja_parse(const char *src, size_t len, struct coord_jinja **out, char *err,
                      size_t elen);
void coord_jinja_free(struct coord_jinja *t);

/* Renders @t with the members of the JSON object @vars as its variables (NULL: none), within
 * @lim (NULL: the defaults). Returns 0 and *@out (malloc'd, NUL-terminated, *@olen bytes), or
 * with @err set: -EINVAL for an error of the template (raise_exception's message verbatim;
 * others "line N: ..."), -E2BIG for a limit passed, -ENOMEM. */
int coord_jinja_render(const struct coord_jinja *t, json_t *vars,
                       const struct coord_jinja_limits *lim, char **out, size_t *olen, char *err,
                       size_t elen);

#endif
