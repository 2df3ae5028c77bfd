/* SPDX-License-Identifier: MIT */
/* tests/test_engine.c: the engine as a library (coordinator/engine/engine.h), in this process with
 * real workers on stories260K:
 *
 * reports:  nothing is printed (stderr stays empty); the weight path comes through the log
 *           callback, the layout, heartbeat and step timings too with verbose and only then;
 *           the accessors say what was started;
 * cancel:   a cancel flag set before the start or a step stops it with -ECANCELED, and nothing
 *           is left in the runtime directory;
 * headers:  a worker that scribbles on the header of the KV or exchange segment (capacities,
 *           offsets) cannot make the coordinator read or write out of bounds: it checks steps
 *           against its own copy of each layout, and a step after the scribble is refused or
 *           fails cleanly, never crashes it (under ASan, any overrun would show);
 * batches:  the four golden sequences in the same steps (prefills and one-token decodes mixed,
 *           one joining late, each leaving when done), at 1 and 2 ranks: every step's greedy
 *           choice is the golden next token; 8 sequences of mixed prefill chunks and decodes,
 *           their KV blocks interleaved, give each the logits it gets alone (f32 and w4a8);
 * windows:  on tiny-phi3 (every layer windowed, W = 64) the scheduler gives blocks before the
 *           window back: two sequences of 1500 positions share a pool of 20 blocks (320
 *           positions), their tokens and log-probabilities bit for bit those of a pool that keeps
 *           every block; tiny-gemma3 (global layers) gives nothing back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include "engine.h"
#include "scheduler.h"
#include "seg.h"
#include "testutil.h"

static char dir[4096];    /* this test's files */
static char rundir[4200]; /* the engine's runtime directory */
static char model[4300];  /* stories260K at f32 */
static char model_w4[4300]; /* and at w4a8 */
static char worker[4300]; /* shardlm-worker beside the shardlm binary */

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "engine");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    tu_path(model_w4, sizeof(model_w4), "%s/w4a8.shlm", dir);
    tu_worker(worker, sizeof(worker));
    return tu_convert(model, "f32", NULL) || tu_convert(model_w4, "w4a8", NULL) ? -1 : 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

/* What the log callback got: one line per message, "D ", "I " or "W " before it. */
struct capture {
    pthread_mutex_t lock;
    char text[1 << 16];
    size_t len;
};

static void capture_log(void *ctx, enum coord_log_level level, const char *msg)
{
    struct capture *c = ctx;
    pthread_mutex_lock(&c->lock);
    int n = snprintf(c->text + c->len, sizeof(c->text) - c->len, "%c %s\n", "DIW"[level], msg);
    c->len += n > 0 && (size_t)n < sizeof(c->text) - c->len ? (size_t)n : 0;
    pthread_mutex_unlock(&c->lock);
}

static struct coord_engine_opts options(struct capture *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->lock, NULL);
    return (struct coord_engine_opts){.model_path = model,
                                      .rundir = rundir,
                                      .worker_path = worker,
                                      .log = capture_log,
                                      .log_ctx = c};
}

static int32_t prompt[] = {1, 403, 407, 261}; /* BOS, then some tokens of the vocabulary */

static void test_reports_through_log(void **state)
{
    for (int verbose = 0; verbose < 2; verbose++) {
        struct capture c;
        struct coord_engine_opts o = options(&c);
        o.verbose = verbose;
        /* stderr into a file for the engine's whole life: it must stay empty */
        char err_path[4300];
        tu_path(err_path, sizeof(err_path), "%s/stderr", dir);
        fflush(stderr);
        int saved = dup(2), fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        assert_true(saved >= 0 && fd >= 0);
        dup2(fd, 2);
        close(fd);
        struct shardlm_err e = {{0}};
        struct coord_engine *g = NULL;
        int rc = coord_engine_start(&g, &o, &e);
        struct coord_seq_step s = {.n_tokens = 4, .tokens = prompt};
        int step = rc ? rc : coord_engine_step(g, &s, 1, &e);
        struct coord_rank_info ri = {0};
        if (!rc) {
            assert_int_equal(coord_engine_n_ranks(g), 1);
            assert_int_equal(coord_engine_model(g)->hdr->cfg.vocab_size, 512);
            assert_string_equal(coord_engine_rundir(g), rundir);
            assert_string_equal(coord_engine_model_path(g), model);
            assert_int_equal(coord_engine_max_seqs(g), 1);
            assert_true(coord_engine_logit_rows(g) >= 1);
            assert_true(coord_engine_exchange_bytes(g) > 0);
            assert_true(coord_engine_stats(g)->ready_ns > coord_engine_stats(g)->start_ns);
            coord_engine_rank(g, 0, &ri);
            assert_true(ri.isa[0]); /* it lives in the engine */
        }
        coord_engine_stop(g);
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        size_t len = 0;
        char *printed = tu_slurp(err_path, &len);
        if (rc || step)
            fprintf(stderr, "start %d, step %d: %s\n", rc, step, e.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(step, 0);
        assert_true(ri.pid > 0 && ri.weights_bytes > 0 && ri.kv_bytes > 0);
        assert_non_null(printed);
        if (len)
            fprintf(stderr, "printed on stderr:\n%s", printed);
        assert_int_equal(len, 0);
        free(printed);
        assert_non_null(strstr(c.text, "I weights f32; kernels "));
        static const char *debug[] = {"D coordinator listens on ipc://", "D rank 0 node ",
                                      "D heartbeat rtt ", "D step 1 prefill tokens 4 wall "};
        for (int i = 0; i < 4 && verbose; i++)
            assert_non_null(strstr(c.text, debug[i]));
        if (!verbose)
            assert_true(c.text[0] != 'D' && !strstr(c.text, "\nD "));
        assert_int_equal(tu_count_run_files(rundir), 0);
    }
}

/* A cancel flag set before the start, or before a step: -ECANCELED, nothing left behind. */
static void test_cancel(void **state)
{
    struct capture c;
    struct coord_engine_opts o = options(&c);
    volatile sig_atomic_t cancel = 1;
    o.cancel = &cancel;
    o.load.no_persist = true; /* a load each time: its cancel check too */
    struct shardlm_err e = {{0}};
    struct coord_engine *g = (struct coord_engine *)&e; /* start must set it to NULL */
    uint64_t t0 = shardlm_now_ns();
    assert_int_equal(coord_engine_start(&g, &o, &e), -ECANCELED);
    assert_null(g);
    assert_string_equal(e.msg, "cancelled");
    assert_true(shardlm_now_ns() - t0 < 3000000000ull); /* no timeout waited out */
    assert_int_equal(tu_count_run_files(rundir), 0);
    assert_false(tu_workers_alive(rundir));

    o.load.no_persist = false;
    cancel = 0;
    assert_int_equal(coord_engine_start(&g, &o, &e), 0);
    struct coord_seq_step s = {.n_tokens = 4, .tokens = prompt};
    assert_int_equal(coord_engine_step(g, &s, 1, &e), 0);
    cancel = 1;
    s = (struct coord_seq_step){.pos = 4, .n_tokens = 1, .tokens = prompt + 1};
    assert_int_equal(coord_engine_step(g, &s, 1, &e), -ECANCELED);
    coord_engine_stop(g);
    assert_int_equal(tu_count_run_files(rundir), 0);
    assert_false(tu_workers_alive(rundir));
}

/* Maps the run segment "<this pid>.@what" of the engine's runtime directory, as a worker does. */
static void *map_run_segment(const char *what, size_t *size)
{
    char path[4400];
    tu_path(path, sizeof(path), "%s/%d.%s", rundir, (int)getpid(), what);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(p != MAP_FAILED);
    *size = (size_t)st.st_size;
    return p;
}

/* A started engine (@restarts as opts.restarts) and its exchange and KV segments mapped here,
 * where the test scribbles as a worker could. */
struct scribbled {
    struct capture c;
    struct coord_engine *g;
    struct seg_exchange *x, truth; /* the mapped header; what it said at start */
    struct seg_kv *kv;
    size_t x_size, kv_size;
};

static void scribble_start(struct scribbled *t, int restarts)
{
    struct coord_engine_opts o = options(&t->c);
    struct shardlm_err e = {{0}};
    o.restarts = restarts;
    assert_int_equal(coord_engine_start(&t->g, &o, &e), 0);
    t->x = map_run_segment(SEG_RUN_EXCHANGE, &t->x_size);
    t->kv = map_run_segment("kv.r0", &t->kv_size);
    t->truth = *t->x;
    assert_int_equal(t->kv->n_blocks, coord_engine_kv_blocks(t->g));
}

/* Stops the engine: it must, cleanly, whatever the headers say now. */
static void scribble_stop(struct scribbled *t)
{
    coord_engine_stop(t->g);
    munmap(t->x, t->x_size);
    munmap(t->kv, t->kv_size);
    assert_int_equal(tu_count_run_files(rundir), 0);
    assert_false(tu_workers_alive(rundir));
}

/* Capacities scribbled larger: the coordinator still refuses what does not fit its own
 * layouts (a sequence slot past the KV's, a step past the exchange's tokens or logits rows),
 * and runs what does, its logits where they are. */
static void test_scribbled_capacities(void **state)
{
    struct scribbled t;
    struct shardlm_err e = {{0}};
    scribble_start(&t, 0);
    const struct seg_exchange *truth = &t.truth;
    t.x->max_tokens = t.x->logit_rows = t.x->max_blocks = UINT32_MAX;
    t.kv->n_blocks = UINT32_MAX;
    assert_int_equal(coord_engine_logit_rows(t.g), truth->logit_rows);

    struct coord_seq_step s = {.seq_id = 1, .n_tokens = 4, .tokens = prompt};
    assert_int_equal(coord_engine_step(t.g, &s, 1, &e), -EINVAL); /* one slot, whatever it says */
    uint32_t far = coord_engine_kv_blocks(t.g);                   /* a block past the pool's */
    s = (struct coord_seq_step){.n_tokens = 4, .tokens = prompt, .blocks = &far};
    assert_int_equal(coord_engine_step(t.g, &s, 1, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "KV block"));
    s = (struct coord_seq_step){.pos = UINT32_MAX - 1, .n_tokens = 4, .tokens = prompt};
    assert_int_equal(coord_engine_step(t.g, &s, 1, &e), -E2BIG); /* past the context */
    struct coord_seq_step two[2] = {{.n_tokens = 1, .tokens = prompt},
                                    {.n_tokens = 1, .tokens = prompt}};
    assert_int_equal(coord_engine_step(t.g, two, 2, &e), -EINVAL);
    int32_t *many = calloc(truth->max_tokens + 1, sizeof(*many));
    s = (struct coord_seq_step){.n_tokens = truth->max_tokens + 1, .tokens = many};
    assert_int_equal(coord_engine_step(t.g, &s, 1, &e), -E2BIG);
    s = (struct coord_seq_step){
        .n_tokens = truth->logit_rows + 1, .tokens = many, .all_logits = true};
    if (truth->logit_rows < truth->max_tokens)
        assert_int_equal(coord_engine_step(t.g, &s, 1, &e), -E2BIG);
    free(many);

    s = (struct coord_seq_step){.n_tokens = 4, .tokens = prompt};
    int rc = coord_engine_step(t.g, &s, 1, &e);
    if (rc)
        fprintf(stderr, "step: %s\n", e.msg);
    assert_int_equal(rc, 0);
    const float *here = (const float *)((char *)t.x + truth->logits_off);
    assert_memory_equal(s.logits, here, truth->vocab * sizeof(float));
    scribble_stop(&t);
}

/* Offsets scribbled far past the segments: the coordinator writes the step's tokens and
 * reserves its memory where its own layouts say, and the step fails cleanly (the worker that
 * follows the scribble dies, and with no restarts that ends the step) - the coordinator lives,
 * and stops cleanly. */
static void test_scribbled_offsets(void **state)
{
    struct scribbled t;
    struct shardlm_err e = {{0}};
    scribble_start(&t, -1);
    t.x->tokens_off = t.x->logits_off = t.x->ar_off = 1ull << 40;
    t.kv->data_off = 1ull << 40;
    struct coord_seq_step s = {.n_tokens = 4, .tokens = prompt};
    int rc = coord_engine_step(t.g, &s, 1, &e);
    print_message("step after the scribble: %d (%s)\n", rc, e.msg);
    assert_true(rc < 0);
    scribble_stop(&t);
}

/* Line @no (from 1) of the golden greedy.tsv: its prompt's and generated ids, one after the
 * other, into @ids (at most @max); the prompt's count into *@n_prompt. Returns the total. */
static int golden_ids(int no, int32_t *ids, int max, int *n_prompt)
{
    char path[4200];
    tu_path(path, sizeof(path), "%s/golden/stories260K/greedy.tsv", tu_data());
    char *tsv = tu_slurp(path, NULL), *line = tsv;
    for (int i = 1; line && i < no; i++)
        line = (line = strchr(line, '\n')) ? line + 1 : NULL;
    assert_non_null(line);
    char *p = strchr(line, '\t') + 1;
    int n = 0;
    for (int field = 0; field < 2; field++) {
        while (*p != '\t' && *p != '\n' && n < max) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p)
                p++;
            else
                ids[n++] = (int32_t)v, p = end;
        }
        if (!field)
            *n_prompt = n;
        p++;
    }
    free(tsv);
    return n;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        best = x[i] > x[best] ? i : best;
    return best;
}

/* --cpus for two workers: the first two CPUs this process may use, one each (the first twice on
 * a one-CPU machine). */
static void two_workers_cpus(char *buf, size_t len)
{
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    int cpu[2] = {-1, -1};
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &set))
            cpu[k++] = c;
    snprintf(buf, len, "%d:%d", cpu[0], cpu[1] >= 0 ? cpu[1] : cpu[0]);
}

static void test_batched_golden(void **state)
{
    enum { NS = 4, MAX_IDS = 300 };
    static int32_t ids[NS][MAX_IDS];
    int n_prompt[NS], total[NS];
    for (int q = 0; q < NS; q++)
        total[q] = golden_ids(q + 1, ids[q], MAX_IDS, &n_prompt[q]);
    char two[32];
    two_workers_cpus(two, sizeof(two));
    for (int R = 1; R <= 2; R++) {
        struct capture c;
        struct coord_engine_opts o = options(&c);
        struct shardlm_err e = {{0}};
        struct coord_engine *g;
        o.max_seqs = NS;
        o.layout.cpus = R == 2 ? two : NULL;
        o.layout.workers = R;
        assert_int_equal(coord_engine_start(&g, &o, &e), 0);
        assert_int_equal(coord_engine_n_ranks(g), R);
        int pos[NS] = {0}, wrong = 0, steps = 0, decoded = 0;
        for (;; steps++) {
            struct coord_seq_step s[NS];
            int n = 0;
            for (int q = 0; q < NS; q++) {
                /* sequence 3 joins at step 5; a sequence leaves at its last golden token */
                if ((q == 3 && steps < 5) || pos[q] == total[q] - 1)
                    continue;
                int len = pos[q] ? 1 : n_prompt[q];
                s[n++] = (struct coord_seq_step){.seq_id = (uint32_t)q,
                                                 .pos = (uint32_t)pos[q],
                                                 .n_tokens = (uint32_t)len,
                                                 .tokens = ids[q] + pos[q]};
            }
            if (!n)
                break;
            assert_int_equal(coord_engine_step(g, s, n, &e), 0);
            for (int i = 0; i < n; i++) {
                int q = (int)s[i].seq_id;
                pos[q] += (int)s[i].n_tokens;
                if (argmax(s[i].logits, 512) != ids[q][pos[q]])
                    wrong++;
                decoded++;
            }
        }
        /* a sequence twice in one step is refused before anything runs */
        struct coord_seq_step dup[2] = {{.seq_id = 1, .n_tokens = 1, .tokens = prompt},
                                        {.seq_id = 1, .pos = 1, .n_tokens = 1, .tokens = prompt}};
        assert_int_equal(coord_engine_step(g, dup, 2, &e), -EINVAL);
        assert_non_null(strstr(e.msg, "sequence 1 twice in one step"));
        fprintf(stderr, "R=%d: 4 golden sequences in %d batched steps, %d of %d choices wrong\n", R,
                steps, wrong, decoded);
        assert_int_equal(wrong, 0);
        int choices = 0; /* one after the prompt, then one per generated token but the last */
        for (int q = 0; q < NS; q++)
            choices += total[q] - n_prompt[q];
        assert_int_equal(decoded, choices);
        coord_engine_stop(g);
        assert_int_equal(tu_count_run_files(rundir), 0);
    }
}

/* `shardlm synth --shape @shape` at f32, converted to @out. Returns the exit status. */
static int synth_model(const char *shape, const char *out)
{
    char gguf[4400];
    tu_path(gguf, sizeof(gguf), "%s/%s.gguf", dir, shape);
    char *synth[] = {(char *)tu_bin(), "synth", "--shape", (char *)shape, "--type", "f32",
                     "-o",             gguf,    NULL};
    char *conv[] = {(char *)tu_bin(), "convert", gguf, "--scheme", "f32", "-o", (char *)out, "-q",
                    NULL};
    struct tu_run *r = malloc(sizeof(*r));
    tu_run_cmd(r, synth, NULL, 120, NULL, NULL);
    int st = r->status;
    if (!st) {
        tu_run_cmd(r, conv, NULL, 120, NULL, NULL);
        st = r->status;
    }
    if (st)
        fprintf(stderr, "synth/convert %s failed (%d): %s", shape, st, r->err);
    unlink(gguf);
    free(r);
    return st;
}

/* What a request got: its tokens and their log-probabilities. */
struct got {
    int32_t tok[2048];
    float lp[2048];
    int n;
    enum coord_finish finish;
};

static void on_got(void *ctx, const struct coord_event *ev)
{
    struct got *g = ctx;
    if (ev->token >= 0 && g->n < 2048) {
        g->tok[g->n] = ev->token;
        g->lp[g->n++] = ev->logprobs ? ev->logprobs->logprob : 0.0f;
    }
    if (ev->finish)
        g->finish = ev->finish;
}

enum { WIN_SEQS = 2, WIN_PROMPT = 100, WIN_NEW = 1400 };

/* Two greedy requests of WIN_PROMPT + WIN_NEW - 1 positions (prompts sharing their first 64
 * tokens: a prefix hit) over the engine of @path with a pool of @kv_blocks, in chunks of 64;
 * through coord_sched_init (@keep false: blocks before the window go back when the model is
 * windowed on every layer) or a backend that keeps every block. Each step audited; the most
 * blocks held into *@peak. Returns what submitting gave (0 or -E2BIG, then nothing ran). */
static int window_run(const char *path, uint32_t kv_blocks, bool keep, struct got *got,
                      uint32_t *peak)
{
    struct capture c;
    struct coord_engine_opts o = options(&c);
    o.model_path = path;
    o.max_seqs = WIN_SEQS;
    o.kv_blocks = kv_blocks;
    o.layout.workers = 1;
    struct shardlm_err e = {{0}};
    struct coord_engine *g;
    assert_int_equal(coord_engine_start(&g, &o, &e), 0);
    struct coord_sched_opts so = {WIN_SEQS, 64, false};
    struct coord_sched *s;
    if (keep) {
        struct coord_sched_backend b;
        coord_sched_engine_backend(g, &b);
        b.window = 0;
        assert_int_equal(coord_sched_init_backend(&s, &b, NULL, &so, &e), 0);
    } else {
        assert_int_equal(coord_sched_init(&s, g, NULL, &so, &e), 0);
    }
    int32_t prompt_ids[WIN_SEQS][WIN_PROMPT];
    int rc = 0;
    for (int q = 0; q < WIN_SEQS && !rc; q++) {
        for (int i = 0; i < WIN_PROMPT; i++)
            prompt_ids[q][i] = (int32_t)((i < 64 ? i * 37 : i * 37 + q * 101) % 500) + 3;
        memset(&got[q], 0, sizeof(got[q]));
        struct coord_request r = {.prompt = prompt_ids[q],
                                  .n_prompt = WIN_PROMPT,
                                  .max_tokens = WIN_NEW,
                                  .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                                  .ignore_eos = true,
                                  .logprobs = 0,
                                  .on_event = on_got,
                                  .ctx = &got[q]};
        uint64_t id;
        rc = coord_sched_submit(s, &r, &id, &e);
    }
    while (!rc && !coord_sched_idle(s)) {
        assert_int_equal(coord_sched_step(s, &e), 0);
        if (coord_sched_audit(s, &e))
            fail_msg("audit: %s", e.msg);
    }
    struct coord_sched_stats st;
    coord_sched_stats(s, &st);
    *peak = st.blocks_peak;
    coord_sched_free(s);
    coord_engine_stop(g);
    assert_int_equal(tu_count_run_files(rundir), 0);
    return rc;
}

/* A step whose table has SEG_KV_NONE for blocks given back: taken by the engine and the worker
 * before every layer's window of the chunk (@windowed), refused anywhere else. */
static void table_with_holes(const char *path, bool windowed)
{
    struct capture c;
    struct coord_engine_opts o = options(&c);
    o.model_path = path;
    o.kv_blocks = 16;
    o.layout.workers = 1;
    struct shardlm_err e = {{0}};
    struct coord_engine *g;
    assert_int_equal(coord_engine_start(&g, &o, &e), 0);
    int32_t ids[100];
    uint32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 0; i < 100; i++)
        ids[i] = (i * 37) % 500 + 3;
    struct coord_seq_step s = {.n_tokens = 100, .tokens = ids, .blocks = table};
    assert_int_equal(coord_engine_step(g, &s, 1, &e), 0);
    /* the query at 100 reads keys 37.. (W 64): blocks 0 and 1 are before its window */
    s = (struct coord_seq_step){.pos = 100, .n_tokens = 1, .tokens = ids, .blocks = table};
    table[0] = table[1] = SEG_KV_NONE;
    assert_int_equal(coord_engine_step(g, &s, 1, &e), windowed ? 0 : -EINVAL);
    table[2] = SEG_KV_NONE;
    s.pos = 101;
    assert_int_equal(coord_engine_step(g, &s, 1, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "KV block 4294967295, the cache has 16"));
    coord_engine_stop(g);
    assert_int_equal(tu_count_run_files(rundir), 0);
}

static void test_window_blocks(void **state)
{
    (void)state;
    static struct got kept[WIN_SEQS], tight[WIN_SEQS];
    char phi3[4400], gemma3[4400];
    tu_path(phi3, sizeof(phi3), "%s/tiny-phi3.shlm", dir);
    tu_path(gemma3, sizeof(gemma3), "%s/tiny-gemma3.shlm", dir);
    assert_int_equal(synth_model("tiny-phi3", phi3), 0);
    assert_int_equal(synth_model("tiny-gemma3", gemma3), 0);
    uint32_t peak_kept, peak;
    /* 94 blocks a sequence kept, nothing given back (as before the scheduler gave any) */
    assert_int_equal(window_run(phi3, 256, true, kept, &peak_kept), 0);
    /* 20 blocks: each sequence holds at most ceil((64 + 64 - 1) / 16) + 1 = 9 */
    assert_int_equal(window_run(phi3, 20, false, tight, &peak), 0);
    fprintf(stderr, "tiny-phi3, 2 sequences of %d positions: %u blocks held at most keeping all, "
                    "%u giving back those before the window\n",
            WIN_PROMPT + WIN_NEW - 1, peak_kept, peak);
    assert_int_equal(peak_kept, 2 * 94 - 4); /* the 64-token prefix's 4 blocks shared */
    assert_true(peak <= 2 * 9);
    for (int q = 0; q < WIN_SEQS; q++) {
        assert_int_equal(kept[q].finish, COORD_FINISH_LENGTH);
        assert_int_equal(kept[q].n, WIN_NEW);
        assert_int_equal(tight[q].n, kept[q].n);
        assert_memory_equal(tight[q].tok, kept[q].tok, sizeof(kept[q].tok[0]) * WIN_NEW);
        assert_memory_equal(tight[q].lp, kept[q].lp, sizeof(kept[q].lp[0]) * WIN_NEW);
    }
    /* global layers read every block: the same requests need their whole length */
    struct got g3[WIN_SEQS];
    assert_int_equal(window_run(gemma3, 20, false, g3, &peak), -E2BIG);
    table_with_holes(phi3, true);
    table_with_holes(gemma3, false);
}

/* KL divergence of softmax(b) from softmax(a) over n logits, in double. */
static double kld(const float *a, const float *b, int n)
{
    double ma = a[0], mb = b[0], sa = 0, sb = 0, k = 0;
    for (int i = 1; i < n; i++) {
        ma = a[i] > ma ? a[i] : ma;
        mb = b[i] > mb ? b[i] : mb;
    }
    for (int i = 0; i < n; i++) {
        sa += exp(a[i] - ma);
        sb += exp(b[i] - mb);
    }
    for (int i = 0; i < n; i++) {
        double pa = exp(a[i] - ma) / sa, lb = b[i] - mb - log(sb), la = a[i] - ma - log(sa);
        k += pa * (la - lb);
    }
    return k;
}

/* eval of a sequence inside a batch of 8: each sequence's logits at every position, batched
 * (prefill chunks of different sizes in the same steps as other sequences' one-token decodes,
 * sequences joining late, KV blocks interleaved between them: block j of sequence q is
 * j * 8 + q), against the same sequence alone in one step. f32 KLD < 1e-9, w4a8 < 1e-6 (the
 * kernels give a row the same result whatever rows share its product), at 1 and 2 ranks. */
static void test_batch_of_8_logits(void **state)
{
    enum { NS = 8, MAX_IDS = 300, VOCAB = 512 };
    static int32_t gold[4][MAX_IDS];
    int n_prompt[4], total[4];
    for (int q = 0; q < 4; q++)
        total[q] = golden_ids(q + 1, gold[q], MAX_IDS, &n_prompt[q]);
    char two[32];
    two_workers_cpus(two, sizeof(two));
    /* sequence q: golden sequence q % 4 from token (q / 4) * 5, 40 + 9q tokens */
    const int32_t *ids[NS];
    int len[NS];
    for (int q = 0; q < NS; q++) {
        ids[q] = gold[q % 4] + (q / 4) * 5;
        len[q] = 40 + 9 * q;
        assert_true((q / 4) * 5 + len[q] <= total[q % 4]);
    }
    static uint32_t tables[NS][32];
    for (int q = 0; q < NS; q++)
        for (int j = 0; j < 32; j++)
            tables[q][j] = (uint32_t)(j * NS + q);
    static float solo[NS][120 * VOCAB], got[NS][120 * VOCAB];
    for (int w = 0; w < 2; w++)
        for (int R = 1; R <= 2; R++) {
            struct capture c;
            struct coord_engine_opts o = options(&c);
            struct shardlm_err e = {{0}};
            struct coord_engine *g;
            o.model_path = w ? model_w4 : model;
            o.max_seqs = NS;
            o.layout.cpus = R == 2 ? two : NULL;
            o.layout.workers = R;
            assert_int_equal(coord_engine_start(&g, &o, &e), 0);
            for (int q = 0; q < NS; q++) {
                struct coord_seq_step s = {.seq_id = 0,
                                           .n_tokens = (uint32_t)len[q],
                                           .tokens = ids[q],
                                           .blocks = tables[q],
                                           .all_logits = true};
                assert_int_equal(coord_engine_step(g, &s, 1, &e), 0);
                memcpy(solo[q], s.logits, (size_t)len[q] * VOCAB * sizeof(float));
            }
            int pos[NS] = {0};
            for (int step = 0;; step++) {
                struct coord_seq_step s[NS];
                int n = 0;
                for (int q = 0; q < NS; q++) {
                    if (step < q / 2 || pos[q] == len[q]) /* pairs join a step apart */
                        continue;
                    /* the prompt (12 + 5q tokens) in chunks of 7 + 3q, then one at a time */
                    int left = 12 + 5 * q - pos[q], chunk = left > 0 ? left : 1;
                    chunk = chunk < 7 + 3 * q ? chunk : 7 + 3 * q;
                    s[n++] = (struct coord_seq_step){.seq_id = (uint32_t)q,
                                                     .pos = (uint32_t)pos[q],
                                                     .n_tokens = (uint32_t)chunk,
                                                     .tokens = ids[q] + pos[q],
                                                     .blocks = tables[q],
                                                     .all_logits = true};
                }
                if (!n)
                    break;
                assert_int_equal(coord_engine_step(g, s, n, &e), 0);
                for (int i = 0; i < n; i++) {
                    int q = (int)s[i].seq_id;
                    memcpy(got[q] + (size_t)pos[q] * VOCAB, s[i].logits,
                           s[i].n_tokens * VOCAB * sizeof(float));
                    pos[q] += (int)s[i].n_tokens;
                }
            }
            double worst = 0;
            for (int q = 0; q < NS; q++)
                for (int t = 0; t < len[q]; t++) {
                    double k = kld(solo[q] + (size_t)t * VOCAB, got[q] + (size_t)t * VOCAB, VOCAB);
                    worst = k > worst ? k : worst;
                }
            fprintf(stderr, "%s R=%d: 8 sequences batched against alone, worst kld %.3g\n",
                    w ? "w4a8" : "f32", R, worst);
            assert_true(worst < (w ? 1e-6 : 1e-9));
            coord_engine_stop(g);
            assert_int_equal(tu_count_run_files(rundir), 0);
        }
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reports_through_log),  cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_scribbled_capacities), cmocka_unit_test(test_scribbled_offsets),
        cmocka_unit_test(test_batched_golden),       cmocka_unit_test(test_batch_of_8_logits),
        cmocka_unit_test(test_window_blocks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
