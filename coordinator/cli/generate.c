/* SPDX-License-Identifier: MIT */
/* coordinator/cli/generate.c: text generation through the scheduler, one prompt or many. */
#include "generate.h"

#include "cli.h"
#include "tokenizer.h"
#include "utf8.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT_FILE_MAX (64u << 20) /* bytes of -f FILE */
#define MAX_PROMPTS 65536

struct gen;

/* One prompt and what became of it. */
struct gen_item {
    struct gen *g;
    const char *prompt; /* its text (the options', or a line of the file buffer) */
    size_t prompt_len;
    int32_t *ids; /* BOS first (malloc'd) */
    int np;
    char *text; /* the continuation so far (malloc'd) */
    size_t len, cap;
    enum coord_finish finish;
    char *error;
    int prompt_tokens, completion_tokens, cached_tokens;
    uint64_t first_ns;
    uint64_t id; /* the scheduler's */
};

struct gen {
    const struct coord_generate_opts *o;
    struct coord_tok tok;
    bool tok_loaded;
    char *file; /* -f FILE's contents, its newlines cut into ends of strings */
    struct gen_item *items;
    int n_items, printed; /* results written, in order */
    bool stream;          /* one prompt, plain text: tokens go out as they come */
    int out_rc;           /* the first failed write to stdout */
    struct coord_sched *sched;
    struct gr_grammar *grammar; /* --json-schema or --regex, shared by the prompts */
};

/* The one message of a failed write to stdout. */
static int stdout_failed(int rc, struct shardlm_err *e)
{
    return shardlm_fail(e, rc, "writing to stdout: %s", strerror(-rc));
}

static int put(const char *s, size_t n)
{
    return fwrite(s, 1, n, stdout) == n ? 0 : errno ? -errno : -EIO;
}

/* Writes the prompt as its token pieces decode (what the model saw, SentencePiece's leading
 * space after BOS dropped), as `generate` always has. */
static int put_prompt(const struct coord_tok *t, const struct gen_item *it)
{
    struct coord_utf8 u = {0};
    char buf[3 * 256 + 12];
    for (int i = 1; i < it->np; i++) {
        size_t len;
        const char *piece = coord_tok_decode(t, it->ids[i - 1], it->ids[i], &len);
        if (!coord_tok_printable(piece, len))
            continue;
        for (size_t off = 0; off < len; off += 256) {
            size_t n = coord_utf8_feed(&u, piece + off, len - off < 256 ? len - off : 256, buf);
            int rc = put(buf, n);
            if (rc)
                return rc;
        }
    }
    return put(buf, coord_utf8_flush(&u, buf));
}

/* Result @i as one JSON line. */
static int put_json(const struct gen_item *it)
{
    json_t *o =
        json_pack("{s:s%,s:s%,s:s,s:i,s:i,s:i}", "prompt", it->prompt, it->prompt_len, "text",
                  it->text ? it->text : "", it->len, "finish_reason", coord_finish_name(it->finish),
                  "prompt_tokens", it->prompt_tokens, "completion_tokens", it->completion_tokens,
                  "cached_tokens", it->cached_tokens);
    if (o && it->error)
        json_object_set_new(o, "error", json_string(it->error));
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!line)
        return -ENOMEM;
    int rc = put(line, strlen(line));
    free(line);
    return rc ? rc : put("\n", 1);
}

/* Writes the finished results that are next in prompt order. */
static void put_done(struct gen *g)
{
    while (!g->out_rc && g->printed < g->n_items && g->items[g->printed].finish) {
        const struct gen_item *it = &g->items[g->printed];
        int rc = 0;
        if (g->o->json)
            rc = put_json(it);
        else {
            char label[32];
            int n = snprintf(label, sizeof(label), "[%d] ", g->printed + 1);
            if (!(rc = put(label, (size_t)n)) && !(rc = put_prompt(&g->tok, it)) &&
                !(rc = put(it->text ? it->text : "", it->len)))
                rc = put("\n", 1);
        }
        if (!rc && fflush(stdout))
            rc = errno ? -errno : -EIO;
        g->out_rc = rc;
        g->printed++;
    }
}

static void on_event(void *ctx, const struct coord_event *ev)
{
    struct gen_item *it = ctx;
    struct gen *g = it->g;
    if (!it->first_ns && ev->token >= 0)
        it->first_ns = shardlm_now_ns();
    if (ev->text_len && g->stream) {
        if (!g->out_rc && (g->out_rc = put(ev->text, ev->text_len)) == 0 && fflush(stdout))
            g->out_rc = errno ? -errno : -EIO;
    } else if (ev->text_len) { /* kept until the result is printed */
        bool grow = it->len + ev->text_len + 1 > it->cap;
        size_t cap = grow ? 2 * (it->len + ev->text_len) + 64 : it->cap;
        char *t = grow ? realloc(it->text, cap) : it->text;
        if (!t)
            g->out_rc = -ENOMEM; /* the run stops; this result keeps what it had */
        else {
            it->cap = cap;
            it->text = t;
            memcpy(it->text + it->len, ev->text, ev->text_len);
            it->len += ev->text_len;
            it->text[it->len] = '\0';
        }
    }
    it->prompt_tokens = ev->prompt_tokens;
    it->completion_tokens = ev->completion_tokens;
    it->cached_tokens = ev->cached_tokens;
    if (ev->finish) {
        it->finish = ev->finish;
        if (ev->error)
            it->error = strdup(ev->error);
        if (!g->stream)
            put_done(g);
    }
}

/* -f FILE: one prompt per line (empty lines skipped, a CR before the newline dropped). */
static int read_prompt_file(struct gen *g, const char ***list, int *n, struct shardlm_err *e)
{
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(g->o->prompt_file, PROMPT_FILE_MAX, &buf, &len, e);
    if (rc)
        return rc;
    if (!(g->file = realloc(buf, len + 1))) { /* room for the last line's end of string */
        free(buf);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    buf = (uint8_t *)g->file;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && buf[j] != '\n')
            j++;
        size_t k = j > i && buf[j - 1] == '\r' ? j - 1 : j;
        if (memchr(buf + i, '\0', k - i))
            return shardlm_fail(e, -EINVAL, "%s: a NUL byte in a prompt", g->o->prompt_file);
        if (k > i) {
            if (*n == MAX_PROMPTS)
                return shardlm_fail(e, -E2BIG, "%s: more than %d prompts", g->o->prompt_file,
                                    MAX_PROMPTS);
            g->file[k] = '\0';
            (*list)[(*n)++] = g->file + i;
        }
        i = j + 1;
    }
    return 0;
}

/* While the workers start: builds the tokenizer, reads and tokenizes every prompt and checks
 * it and -n against the context, so a bad prompt fails before any step (and SIGTERM is seen
 * within a few ms of any of this: the encoder is linear, ~20 MB/s). */
static int load_prompts(struct coord_engine *eng, void *arg, struct shardlm_err *e)
{
    struct gen *g = arg;
    const struct coord_generate_opts *o = g->o;
    const struct shlm_model *m = coord_engine_model(eng);
    int rc = coord_tok_from_shlm(&g->tok, m, o->engine.model_path, e);
    if (rc)
        return rc;
    g->tok_loaded = true;
    const char **list = calloc(MAX_PROMPTS + (size_t)o->n_prompts, sizeof(*list));
    int n = 0;
    if (!list)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    for (int i = 0; i < o->n_prompts; i++)
        list[n++] = o->prompts[i];
    if (o->prompt_file && (rc = read_prompt_file(g, &list, &n, e))) {
        free(list);
        return rc;
    }
    if (!n) {
        free(list);
        return shardlm_fail(e, -EINVAL, "%s holds no prompt", o->prompt_file);
    }
    if (!(g->items = calloc((size_t)n, sizeof(*g->items)))) {
        free(list);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    g->n_items = n;
    int ctx = (int)m->hdr->cfg.seq_len;
    for (int i = 0; i < n; i++) {
        struct gen_item *it = &g->items[i];
        char who[32] = "";
        if (n > 1)
            snprintf(who, sizeof(who), "prompt %d: ", i + 1);
        it->prompt = list[i];
        it->prompt_len = strlen(list[i]);
        if (!coord_utf8_valid(it->prompt, it->prompt_len, NULL)) {
            free(list);
            return shardlm_fail(e, -EILSEQ, "%snot valid UTF-8", who);
        }
        int max = (int)it->prompt_len + 3;
        if (!(it->ids = malloc((size_t)max * sizeof(int32_t)))) {
            free(list);
            return shardlm_fail(e, -ENOMEM, "out of memory");
        }
        struct shardlm_err why;
        int np = it->np = coord_tok_encode_err(&g->tok, it->prompt, strlen(it->prompt),
                                               COORD_TOK_ENC_BOS, it->ids, max, &why);
        if (np < 0 || np > ctx || (o->n > 0 && np + o->n - 1 > ctx)) {
            free(list);
            if (np < 0)
                return shardlm_fail(e, np, "%scannot tokenize the prompt: %s", who, why.msg);
            if (np > ctx)
                return shardlm_fail(e, -E2BIG,
                                    "%sthe prompt is %d tokens, longer than the context of %d", who,
                                    np, ctx);
            /* the last new token is sampled, never fed: np + n - 1 positions */
            return shardlm_fail(e, -E2BIG,
                                "%sthe prompt (%d tokens) plus -n %d exceeds the context of "
                                "%d; use -n %d or less",
                                who, np, o->n, ctx, ctx - np + 1);
        }
    }
    free(list);
    return 0;
}

/* Submits every prompt (seeded sampling: prompt i draws from seed + i). */
static int submit_all(struct gen *g, struct shardlm_err *e)
{
    const struct coord_generate_opts *o = g->o;
    for (int i = 0; i < g->n_items; i++) {
        struct gen_item *it = &g->items[i];
        it->g = g;
        it->prompt_tokens = it->np;
        if (o->n == 0) { /* -n 0: the prompt alone */
            it->finish = COORD_FINISH_LENGTH;
            continue;
        }
        struct coord_request r = {.prompt = it->ids,
                                  .n_prompt = it->np,
                                  .max_tokens = o->n,
                                  .sampling = o->sampling,
                                  .stop = o->stop,
                                  .n_stop = o->n_stop,
                                  .logprobs = -1,
                                  .grammar = g->grammar,
                                  .on_event = on_event,
                                  .ctx = it};
        r.sampling.seed = o->sampling.seed + (uint64_t)i;
        int rc = coord_sched_submit(g->sched, &r, &it->id, e);
        if (rc) {
            if (g->n_items > 1) {
                char why[sizeof(e->msg)];
                snprintf(why, sizeof(why), "%s", e->msg);
                shardlm_fail(e, rc, "prompt %d: %s", i + 1, why);
            }
            return rc;
        }
    }
    return 0;
}

/* The `--stats` line of the scheduler: steps, tokens, KV blocks, prefix cache, sampler share. */
static void print_sched_stats(const struct coord_sched *s, FILE *f)
{
    struct coord_sched_stats st;
    coord_sched_stats(s, &st);
    fprintf(f,
            "sched steps=%llu prefill_tokens=%llu decode_tokens=%llu preemptions=%llu "
            "kv_blocks=%u kv_used=%u kv_cached=%u prefix_hit_tokens=%llu/%llu "
            "sampler_share=%.4f kv_peak=%u kv_dropped=%llu\n",
            (unsigned long long)st.steps, (unsigned long long)st.prefill_tokens,
            (unsigned long long)st.decode_tokens, (unsigned long long)st.preemptions, st.blocks,
            st.blocks_used, st.blocks_cached, (unsigned long long)st.cached_tokens,
            (unsigned long long)st.prompt_tokens,
            st.step_ns ? (double)st.sample_ns / (double)st.step_ns : 0.0, st.blocks_peak,
            (unsigned long long)st.blocks_dropped);
}

static void gen_free(struct gen *g)
{
    for (int i = 0; g->items && i < g->n_items; i++) {
        free(g->items[i].ids);
        free(g->items[i].text);
        free(g->items[i].error);
    }
    free(g->items);
    free(g->file);
    if (g->tok_loaded)
        coord_tok_free(&g->tok);
    gr_grammar_free(g->grammar);
}

/* --json-schema FILE, --regex RE or --grammar FILE, compiled before the model starts: a schema the
 * engine cannot compile is refused with the keyword named, before anything runs. Returns 0 or
 * -errno. */
static int compile_grammar(struct gen *g, struct shardlm_err *e)
{
    const struct coord_generate_opts *o = g->o;
    if (o->regex)
        return gr_compile_regex(o->regex, strlen(o->regex), NULL, &g->grammar, e);
    const char *path = o->json_schema_path ? o->json_schema_path : o->gbnf_path;
    if (!path)
        return 0;
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(path, 16u << 20, &buf, &len, e);
    if (rc)
        return rc;
    if (o->gbnf_path) {
        rc = gr_compile_gbnf((const char *)buf, len, NULL, &g->grammar, e);
        goto out;
    }
    /* compact JSON, as OpenAI's structured outputs write it: whitespace a model may pad a
     * value with forever is not offered (MaskBench's note: preferred unless the model was tuned
     * on indented JSON) */
    struct gr_opts go = {.max_ws = -1};
    rc = gr_compile_json_schema((const char *)buf, len, &go, &g->grammar, e);
out:
    free(buf);
    if (rc) {
        char why[sizeof(e->msg)];
        snprintf(why, sizeof(why), "%s", e->msg);
        shardlm_fail(e, rc, "%s: %s", path, why);
    }
    return rc;
}

int coord_generate(const struct coord_generate_opts *o, struct shardlm_err *e)
{
    struct coord_engine *eng;
    struct gen g = {.o = o};
    struct coord_engine_opts eo = o->engine;
    eo.while_starting = load_prompts;
    eo.arg = &g;
    /* as many sequences at once as there are prompts (16 at most), unless told */
    int n_cli = o->n_prompts + (o->prompt_file ? 16 : 0);
    if (!eo.max_seqs)
        eo.max_seqs = n_cli < 1 ? 1 : n_cli > 16 ? 16 : (uint32_t)n_cli;
    eo.kv_fit = true;
    int rc = compile_grammar(&g, e);
    if (rc) {
        gen_free(&g);
        return rc;
    }
    rc = coord_engine_start(&eng, &eo, e);
    if (rc) {
        gen_free(&g);
        return rc;
    }
    struct coord_sched_opts so = o->sched;
    so.max_seqs = eo.max_seqs;
    if ((rc = coord_sched_init(&g.sched, eng, &g.tok, &so, e)) || (rc = submit_all(&g, e)))
        goto out;
    g.stream = g.n_items == 1 && !o->json;
    if (g.stream && (rc = put_prompt(&g.tok, &g.items[0]))) {
        stdout_failed(rc, e);
        goto out;
    }
    if (g.stream)
        fflush(stdout);
    uint64_t t0 = shardlm_now_ns();
    while (!coord_sched_idle(g.sched)) {
        if ((rc = coord_sched_step(g.sched, e)))
            break;
        if (g.out_rc) { /* stdout is gone or full: stop generating for it */
            for (int i = 0; i < g.n_items; i++)
                coord_sched_cancel(g.sched, g.items[i].id);
        }
    }
    if (g.stream && !g.out_rc && !ferror(stdout))
        g.out_rc = put("\n", 1) ? (errno ? -errno : -EIO) : fflush(stdout) ? -EIO : 0;
    if (!g.stream)
        put_done(&g); /* results cut short by an error or a signal: what they had */
    if (!rc && g.out_rc)
        rc = g.out_rc == -ENOMEM ? shardlm_fail(e, -ENOMEM, "out of memory")
                                 : stdout_failed(g.out_rc, e);
    if (o->engine.verbose) {
        uint64_t t1 = shardlm_now_ns(), first = 0;
        int produced = 0, np = 0;
        for (int i = 0; i < g.n_items; i++) {
            produced += g.items[i].completion_tokens;
            np += g.items[i].np;
            if (g.items[i].first_ns && (!first || g.items[i].first_ns < first))
                first = g.items[i].first_ns;
        }
        if (first && g.n_items == 1)
            fprintf(stderr,
                    "prompt %d tokens, generated %d; first token %.1f ms, decode %.1f tok/s\n", np,
                    produced, (double)(first - t0) / 1e6,
                    produced > 1 ? (produced - 1) / ((double)(t1 - first) / 1e9) : 0.0);
        else if (first)
            fprintf(stderr,
                    "%d prompts, %d tokens, generated %d; first token %.1f ms, %.1f tok/s in "
                    "all\n",
                    g.n_items, np, produced, (double)(first - t0) / 1e6,
                    produced / ((double)(t1 - t0) / 1e9));
    }
    if (o->engine.load.stats) {
        uint64_t first = 0;
        for (int i = 0; i < g.n_items; i++)
            if (g.items[i].first_ns && (!first || g.items[i].first_ns < first))
                first = g.items[i].first_ns;
        print_sched_stats(g.sched, stderr);
        coord_cli_print_stats(eng, first, stderr);
    }
out:
    coord_sched_free(g.sched);
    gen_free(&g);
    coord_engine_stop(eng);
    return rc;
}
