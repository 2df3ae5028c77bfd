/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_internal.h: what the Jinja interpreter's files share - the arena, the
 * syntax tree, values and the render state.
 *
 * Errors leave through longjmp: the parser and the evaluator are recursive, and everything they
 * allocate comes from an arena freed whole (the template's, or the render's), so an error deep
 * in an expression unwinds to coord_jinja_parse() / coord_jinja_render() with nothing to free on
 * the way. */
#ifndef SHARDLM_COORD_JINJA_INTERNAL_H
#define SHARDLM_COORD_JINJA_INTERNAL_H

#include "jinja.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena ---- */
struct jarena {
    struct jchunk *head;
    size_t used, limit; /* bytes taken from malloc, and the most allowed */
};
struct jfail {
    jmp_buf jb;
    int rc; /* -EINVAL, -E2BIG, -ENOMEM */
    char msg[256];
};
/* @n bytes (zeroed, 16-aligned) from @a; past its limit or out of memory, fails through @f. */
void *jinja_alloc(struct jarena *a, size_t n, struct jfail *f);
void jinja_arena_free(struct jarena *a);
_Noreturn void jinja_throw(struct jfail *f, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- syntax tree ---- */
enum jx_kind {
    JX_LIT,     /* lit */
    JX_NAME,    /* name */
    JX_ATTR,    /* a.name */
    JX_ITEM,    /* a[b] */
    JX_SLICE,   /* a[args[0]:args[1]:args[2]] (NULL: omitted) */
    JX_CALL,    /* a(args, kw=...) */
    JX_FILTER,  /* a | name(args) - a is NULL inside a filter block */
    JX_TEST,    /* a is [not] name(args) */
    JX_UNARY,   /* op a: -, +, not */
    JX_BINARY,  /* a op b: + - * / // % ** ~ */
    JX_AND,     /* a and b */
    JX_OR,      /* a or b */
    JX_COMPARE, /* args[0] ops[0] args[1] ops[1] args[2] ... */
    JX_COND,    /* b if a else c (c NULL: undefined) */
    JX_LIST,    /* [args] */
    JX_TUPLE,   /* (args) */
    JX_DICT,    /* {args[0]: args[1], ...} */
};
/* operators of JX_BINARY and JX_UNARY; jinja_op_names[op] is each one's Python spelling */
enum jinja_op {
    JINJA_OP_ADD,      /* a + b */
    JINJA_OP_SUB,      /* a - b */
    JINJA_OP_MUL,      /* a * b */
    JINJA_OP_DIV,      /* a / b */
    JINJA_OP_FLOORDIV, /* a // b */
    JINJA_OP_MOD,      /* a % b */
    JINJA_OP_POW,      /* a ** b */
    JINJA_OP_CONCAT,   /* a ~ b */
    JINJA_OP_NEG,      /* -a */
    JINJA_OP_POS,      /* +a */
    JINJA_OP_NOT,      /* not a */
};
extern const char *const jinja_op_names[];
/* comparison operators of JX_COMPARE */
enum jinja_cmp {
    JINJA_CMP_EQ,
    JINJA_CMP_NE,
    JINJA_CMP_LT,
    JINJA_CMP_LE,
    JINJA_CMP_GT,
    JINJA_CMP_GE,
    JINJA_CMP_IN,
    JINJA_CMP_NOTIN
};

struct jv;
struct jx {
    enum jx_kind kind;
    int line;
    enum jinja_op op; /* JX_UNARY, JX_BINARY */
    bool negated;     /* JX_TEST: is not */
    struct jv *lit;
    const char *name;
    struct jx *a, *b, *c;
    struct jx **args;
    const char **kw; /* (nargs) keyword of each argument, NULL for positional ones */
    int nargs;
    enum jinja_cmp *ops; /* JX_COMPARE: (nargs - 1) */
};

enum js_kind {
    JS_TEXT,     /* text, len */
    JS_OUTPUT,   /* {{ expr }} */
    JS_IF,       /* if expr: body, else orelse (elif: an JS_IF in orelse) */
    JS_FOR,      /* for targets in expr [if cond]: body, else orelse */
    JS_SET,      /* set targets (or ns.attr) = expr */
    JS_SETBLOCK, /* set target: body, through filter */
    JS_MACRO,    /* macro name(targets = defaults): body */
    JS_FILTER,   /* filter: body through expr (a JX_FILTER chain on NULL) */
    JS_BREAK,
    JS_CONTINUE,
};
struct js {
    enum js_kind kind;
    int line;
    struct js *next;
    const char *text;
    size_t len;
    struct jx *expr, *cond, *filter;
    struct js *body, *orelse;
    const char **targets; /* for / set names, macro parameters */
    struct jx **defaults; /* macro: (ntargets) default of each parameter or NULL */
    int ntargets;
    const char *attr; /* set ns.attr: targets[0] is ns */
    const char *name; /* macro */
};

struct coord_jinja {
    struct jarena arena;
    struct js *body;
};

/* ---- values ---- */
enum jv_type {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,
    JV_MACRO,
    JV_FUNC,
    JV_LOOP
};
struct jctx;
struct jinja_fn;
typedef struct jv *(*jfunc)(struct jctx *c, struct jv *self, struct jv **args, const char **kw,
                            int n, int line);
struct jv {
    enum jv_type t;
    bool tuple; /* JV_LIST: a tuple */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s; /* UTF-8, NUL-terminated */
            size_t n;
        } str;
        struct {
            struct jv **v;
            size_t n;
        } list;
        struct { /* JV_DICT and JV_NS, in insertion order */
            struct jv **k, **v;
            size_t n, cap;
        } dict;
        struct {
            const struct js *def;
            struct jscope *closure;
        } macro;
        struct {
            jfunc fn;        /* NULL for a method: see method */
            struct jv *self; /* a bound method's object */
            const char *name;
            const struct jinja_fn *method; /* a bound method's entry, or NULL */
        } func;
        struct { /* a for loop's `loop`: its attributes are computed when read */
            const struct jv *items;
            size_t i;
        } loop;
        const char *undef; /* what was looked up, for the error that using it raises */
    };
};

/* ---- render state ---- */
struct jscope {
    struct jscope *parent;
    const char **names;
    struct jv **vals;
    int n, cap;
};
struct jctx {
    struct jfail *fail;
    struct jarena *arena;
    const struct coord_jinja_limits *lim;
    long steps;
    int depth;  /* nested macro calls */
    int vdepth; /* nested values being printed or compared (a namespace may hold itself) */
    char *out; /* the rendering so far (malloc'd) */
    size_t len, cap;
    struct jscope *globals;
};

/* ---- tokens (jinja_lex.c) ---- */
enum jt {
    JT_EOF,
    JT_DATA,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP
};

struct jtok {
    enum jt t;
    int line;
    const char *s; /* DATA, NAME, OP, STRING (decoded): NUL-terminated */
    size_t n;
    int64_t i;
    double f;
};

struct jparse {
    struct jarena *a;
    struct jfail *f;
    const char *src;
    size_t len;
    struct jtok *toks;
    size_t ntok, cap, pos;
    int depth, max_depth;
};

/* Appends the tokens of @src (@len bytes) to @p, the last one JT_EOF; fails through p->f. */
void jinja_lex(struct jparse *p, const char *src, size_t len);
/* Fails through p->f with "line @line: @what". */
_Noreturn void jinja_perr(struct jparse *p, int line, const char *what);

/* jinja_parse.c */
struct js *jinja_parse(const char *src, size_t len, struct jarena *a, struct jfail *f, int depth);

/* jinja_eval.c */
/* calls macro @m / reads loop.@name */
struct jv *jinja_call_macro(struct jctx *c, struct jv *m, struct jv **args, const char **kw, int n,
                            int line);
struct jv *jinja_loop_attr(struct jctx *c, struct jv *l, const char *name);

/* jinja_value.c */
/* None, True and False, shared by every render on every thread: const (in read-only memory, so
 * a write would fault instead of changing another render's value) and never written - the
 * interpreter fills in only values it has just made. jinja_shared() hands one out as the plain
 * struct jv * that values travel as. */
extern const struct jv jinja_none, jinja_true, jinja_false;
static inline struct jv *jinja_shared(const struct jv *v) { return (struct jv *)v; }
_Noreturn void jinja_err(struct jctx *c, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void jinja_charge(struct jctx *c, size_t n); /* n steps */
/* Entering one more level of a nested value (print, compare): fails past 256. Leave with
 * c->vdepth--. */
void jinja_deeper(struct jctx *c, int line);
struct jv *jinja_str(struct jctx *c, const char *s, size_t n); /* copies */
struct jv *jinja_int(struct jctx *c, int64_t i);
struct jv *jinja_float(struct jctx *c, double f);
struct jv *jinja_bool(bool b);
struct jv *jinja_list(struct jctx *c, size_t n); /* n slots to fill */
struct jv *jinja_dict(struct jctx *c, size_t cap);
void jinja_dict_put(struct jctx *c, struct jv *d, struct jv *k, struct jv *v);
struct jv *jinja_dict_get(struct jctx *c, const struct jv *d, const struct jv *k);
struct jv *jinja_dict_gets(struct jctx *c, const struct jv *d, const char *k);
struct jv *jinja_undef(struct jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
struct jv *jinja_from_json(struct jctx *c, json_t *j, int depth);
bool jinja_truthy(const struct jv *v);
bool jinja_equal(struct jctx *c, const struct jv *a, const struct jv *b);
int jinja_compare(struct jctx *c, const struct jv *a, const struct jv *b, int line); /* <0, 0, >0 */
const char *jinja_type_name(const struct jv *v);
/* str() and repr() of @v, appended to a growing buffer */
struct jbuf {
    char *s;
    size_t n, cap;
};
void jinja_buf_put(struct jctx *c, struct jbuf *b, const char *s, size_t n);
void jinja_str_into(struct jctx *c, struct jbuf *b, const struct jv *v, bool repr, int line);
struct jv *jinja_to_str(struct jctx *c, struct jv *v, int line); /* str(v) as a JV_STR */
struct jv *jinja_getattr(struct jctx *c, struct jv *o, const char *name, int line);
struct jv *jinja_getitem(struct jctx *c, struct jv *o, struct jv *k, int line);
struct jv *jinja_call(struct jctx *c, struct jv *f, struct jv **args, const char **kw, int n,
                      int line);
/* the items of an iterable (str: its characters, dict: its keys, undefined: none) */
struct jv *jinja_iter_list(struct jctx *c, struct jv *v, int line);
/* o[parts[0]:parts[1]:parts[2]] (NULL: omitted) */
struct jv *jinja_slice(struct jctx *c, struct jv *o, struct jv *parts[3], int line);
struct jv *jinja_new(struct jctx *c, enum jv_type t); /* a zeroed value of type @t */
/* fails with the message an undefined value carries */
_Noreturn void jinja_undefined_error(struct jctx *c, const struct jv *v, int line);
static inline bool jinja_is_num(const struct jv *v)
{
    return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
}
static inline double jinja_num_f(const struct jv *v)
{
    return v->t == JV_FLOAT ? v->f : v->t == JV_INT ? (double)v->i : v->b;
}
static inline int64_t jinja_num_i(const struct jv *v) { return v->t == JV_INT ? v->i : v->b; }
size_t jinja_utf8_count(const char *s, size_t n);
bool jinja_isspace_at(const char *s, size_t n, size_t *w); /* Python's str.isspace() of one char */

/* ---- the library: filters, tests and methods as tables ---- */
/* A filter, a test or a method: its name, the positional arguments it needs (fewer fail with
 * @too_few, a format that takes the name; NULL where min_args is 0) and its function. A shared
 * function tells the names it serves apart by @name. */
typedef struct jv *(*jinja_filter_fn)(struct jctx *c, const char *name, struct jv *v,
                                      struct jv **args, const char **kw, int n, int line);
typedef bool (*jinja_test_fn)(struct jctx *c, const char *name, struct jv *v, struct jv **args,
                              int n, int line);
typedef struct jv *(*jinja_method_fn)(struct jctx *c, const char *name, struct jv *self,
                                      struct jv **args, const char **kw, int n, int line);
struct jinja_fn {
    const char *name;
    int min_args;
    const char *too_few;
    union {
        jinja_filter_fn filter;
        jinja_test_fn test;
        jinja_method_fn method;
    };
};
/* jinja_filters.c, jinja_tests.c, jinja_methods.c: each table's entries, sorted by name */
extern const struct jinja_fn jinja_filters[], jinja_tests[], jinja_str_methods[],
    jinja_dict_methods[], jinja_list_methods[];
extern const size_t jinja_nfilters, jinja_ntests, jinja_nstr_methods, jinja_ndict_methods,
    jinja_nlist_methods;
/* The entry named @name of @table (@n entries, sorted by name), or NULL. */
const struct jinja_fn *jinja_lookup(const struct jinja_fn *table, size_t n, const char *name);
/* Fails with @f's too_few message when the @n arguments of a call (@kw: each one's keyword,
 * NULL for a positional one; @kw NULL: all positional) hold fewer positional ones than @f
 * needs. */
void jinja_check_arity(struct jctx *c, const struct jinja_fn *f, const char **kw, int n, int line);

/* jinja_filters.c: filter @name applied to @v */
struct jv *jinja_filter(struct jctx *c, const char *name, struct jv *v, struct jv **args,
                        const char **kw, int n, int line);
/* jinja_tests.c: `v is name(args)` */
bool jinja_test(struct jctx *c, const char *name, struct jv *v, struct jv **args, int n, int line);
/* jinja_methods.c: @o's method @name bound to it (a JV_FUNC whose func.method is the entry);
 * NULL: none. Calling it: jinja_call_method(). */
struct jv *jinja_method(struct jctx *c, struct jv *o, const char *name);
struct jv *jinja_call_method(struct jctx *c, const struct jv *f, struct jv **args, const char **kw,
                             int n, int line);
struct jv *jinja_global(const char *name); /* NULL: none */

/* jinja_text.c: what filters and methods share */
/* argument @pos (-1: none) or keyword @name (NULL: none) of a call, or NULL */
struct jv *jinja_arg(struct jv **args, const char **kw, int n, int pos, const char *name);
/* @v when it is a str (an undefined fails with its own message; else "@what: expected a string")
 */
struct jv *jinja_need_str(struct jctx *c, struct jv *v, const char *what, int line);
/* @v as an integer (bool: 0 or 1), else fails "@what: expected an integer" */
int64_t jinja_need_int(struct jctx *c, struct jv *v, const char *what, int line);
/* the text of @b as a str value (taking its buffer) */
struct jv *jinja_mkstr(struct jctx *c, struct jbuf *b);
/* width in bytes of the UTF-8 character at @s */
size_t jinja_char_width(const char *s, size_t n);
/* @v's text Python's str.strip(chars) way: @how 1 left, 2 right, 3 both; chars NULL: spaces */
struct jv *jinja_strip(struct jctx *c, struct jv *v, const struct jv *chars, int how);
enum jinja_case { JINJA_CASE_LOWER, JINJA_CASE_UPPER, JINJA_CASE_TITLE, JINJA_CASE_CAPITALIZE };
/* the mapping of the filter or method @name: lower, upper, title or capitalize */
enum jinja_case jinja_case_of(const char *name);
/* @v's text with ASCII letters mapped */
struct jv *jinja_case_map(struct jctx *c, struct jv *v, enum jinja_case mode);
/* str.split(sep, max) (@right: rsplit) */
struct jv *jinja_split(struct jctx *c, struct jv *s, struct jv *sep, int64_t max, bool right,
                       int line);
/* str.replace(old, new, count) (count -1: all) */
struct jv *jinja_replace(struct jctx *c, struct jv *s, struct jv *old, struct jv *new,
                         int64_t count, int line);
/* json.dumps(v) appended to @b */
void jinja_tojson(struct jctx *c, struct jbuf *b, const struct jv *v, int indent, int level,
                  const char *item_sep, const char *key_sep, bool sort_keys, bool ascii, int line);

#endif
