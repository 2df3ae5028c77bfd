/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/grammar.h: structured outputs - a grammar engine of our own.
 *
 * A grammar is context-free over lexemes, and each lexeme a regular expression over bytes: a
 * lexer (a DFA built lazily over the lexemes' NFA) feeds an Earley parser. Sources: JSON Schema,
 * a regular expression, a choice among strings, llama.cpp's GBNF. For one sequence (a matcher)
 * the engine computes the tokens of the vocabulary the grammar allows next - walking a trie of
 * the tokens' bytes, so tokens that share a prefix share its work - and advances by a token.
 *
 * Lexing is greedy: a lexeme ends where the next byte cannot continue it (JSON's lexemes end
 * there anyway). Not thread-safe: a grammar's lexer grows as matchers use it, so one thread uses
 * a grammar and its matchers at a time.
 */
#ifndef SHARDLM_COORD_GRAMMAR_H
#define SHARDLM_COORD_GRAMMAR_H

#include "common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gr_grammar; /* a compiled grammar: its lexer, rules and caches */
struct gr_vocab;   /* a vocabulary's byte strings as a trie */
struct gr_matcher; /* one sequence's place in a grammar */

/* How a grammar is compiled. Zero is the default of each field. */
struct gr_opts {
    int max_ws;          /* JSON: the most whitespace bytes in a row (0: 16; -1: none at all) */
    long max_nfa_states; /* 0: 2,000,000 */
    long max_dfa_states; /* 0: 200,000 */
    long max_rules;      /* 0: 1,000,000 */
    /* a frame around the output, as bytes (control tokens spelled with GR_SPECIAL, below):
     * reasoning may come first - THINK_OPEN, any text without THINK_CLOSE, THINK_CLOSE, up to 4
     * whitespace bytes (think_open "": the output starts inside the reasoning, which must
     * close) - then LEAD (a channel's header), then what the source describes. NULL: none */
    const char *think_open, *think_close, *lead;
};

/* Compiles the JSON Schema @schema (@len bytes of JSON text). Returns 0 or -EINVAL with @e
 * naming the keyword (and its place) that cannot be compiled, -E2BIG for a schema past the
 * limits, -ENOMEM. Free with gr_grammar_free(). */
int gr_compile_json_schema(const char *schema, size_t len, const struct gr_opts *o,
                           struct gr_grammar **out, struct shardlm_err *e);
/* Any JSON value of type object (OpenAI's json_object). */
int gr_compile_json_object(const struct gr_opts *o, struct gr_grammar **out, struct shardlm_err *e);
/* The whole output matches the ECMAScript regular expression @re (@len bytes). */
int gr_compile_regex(const char *re, size_t len, const struct gr_opts *o, struct gr_grammar **out,
                     struct shardlm_err *e);
/* The output is one of the @n strings @s (lengths @lens). */
int gr_compile_choice(const char *const *s, const size_t *lens, int n, const struct gr_opts *o,
                      struct gr_grammar **out, struct shardlm_err *e);
/* llama.cpp's GBNF grammar @src (@len bytes), start rule "root". */
int gr_compile_gbnf(const char *src, size_t len, const struct gr_opts *o, struct gr_grammar **out,
                    struct shardlm_err *e);

/* A control token's text in a grammar: GR_SPECIAL then the token's text. A vocabulary spells
 * control tokens so (gr_vocab_new), and no source makes the byte 0xFF (not UTF-8), so a grammar
 * allows one only where it names it: a tool call's markers, never inside a string. */
#define GR_SPECIAL "\xff"

/* How a model writes its tool calls, as bytes (control tokens marked with GR_SPECIAL; NULL is
 * ""): the calls are BEGIN CALL (SEP CALL)* END, a call PRE NAME MID ARGS POST with ARGS the
 * arguments' JSON - or, with @name_key, PRE {"<name_key>": "NAME", "<args_key>": ARGS} POST, one
 * JSON object - or, with @xml, ARGS written as Qwen3-Coder writes them: for each argument
 * <parameter=KEY>\nVALUE\n</parameter>\n, a string's VALUE raw, another's as JSON. */
struct gr_call_syntax {
    const char *begin, *end, *sep, *pre, *mid, *post;
    const char *name_key, *args_key;
    bool xml;
};

/* The calls a grammar allows: of the @n tools named @names, whose arguments follow the JSON
 * Schemas @params (jansson objects; NULL: any object), in syntax @syn; one call, or any number
 * when @parallel. */
struct gr_tools {
    const struct gr_call_syntax *syn;
    const char *const *names;
    struct json_t *const *params;
    int n;
    bool parallel;
};
int gr_compile_tool_calls(const struct gr_tools *t, const struct gr_opts *o,
                          struct gr_grammar **out, struct shardlm_err *e);
void gr_grammar_free(struct gr_grammar *g);
/* Whether the grammar's lexer hit its DFA limit (masks may then refuse what it would allow). */
bool gr_grammar_overflow(const struct gr_grammar *g);

/* The vocabulary: token i is the @lens[i] bytes at @bytes[i] (a control token's: GR_SPECIAL and
 * its text); a token with bytes NULL (unused ids) is never allowed by a grammar; @eos (-1: none)
 * ends the output, allowed where the grammar is complete. Returns 0 or -ENOMEM / -EINVAL. Free with
 * gr_vocab_free(). */
int gr_vocab_new(int n, const char *const *bytes, const uint32_t *lens, int eos,
                 struct gr_vocab **out, struct shardlm_err *e);
void gr_vocab_free(struct gr_vocab *v);
int gr_vocab_size(const struct gr_vocab *v);
/* Words of a mask: (n + 31) / 32. */
int gr_mask_words(const struct gr_vocab *v);

/* A sequence at the start of @g over @v (both outlive it). Returns 0 or -errno. */
int gr_matcher_new(struct gr_grammar *g, const struct gr_vocab *v, struct gr_matcher **out,
                   struct shardlm_err *e);
/* A copy of @m in its present state (n-best, forks). */
int gr_matcher_clone(const struct gr_matcher *m, struct gr_matcher **out, struct shardlm_err *e);
void gr_matcher_free(struct gr_matcher *m);
/* Fills @mask (gr_mask_words() words; bit t of word t / 32: token t is allowed). Returns the
 * number of tokens allowed (0: a dead end, which a well-formed grammar never reaches) or -errno. */
long gr_matcher_mask(struct gr_matcher *m, uint32_t *mask);
/* Advances by token @t: true, or false with the state unchanged (the grammar refuses it).
 * The EOS token is accepted where the grammar is complete, and ends the matcher. */
bool gr_matcher_commit(struct gr_matcher *m, int t);
/* Advances by the bytes @s (@n): true, or false with the state unchanged. */
bool gr_matcher_commit_bytes(struct gr_matcher *m, const char *s, size_t n);
/* Whether the text so far is a complete sentence of the grammar. */
bool gr_matcher_accepting(struct gr_matcher *m);
/* Whether EOS was committed. */
bool gr_matcher_done(const struct gr_matcher *m);

#endif
