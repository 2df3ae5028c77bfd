/* SPDX-License-Identifier: MIT */
/* kernels/kn_prefetch.c: which software prefetch feeds a decode GEMV's weight stream best on
 * this host, found by timing calls of each matrix shape on each thread.
 *
 * Why measure instead of fixing one: on the Zen 4 VM the kernels were tuned on, prefetching
 * 4 KiB ahead into L1 gave the W4A8 tile GEMV 31-33 GB/s against 26 at 1 KiB; on a second VM of the
 * same kind the same prefetch held it to 15-16 GB/s while the hardware prefetcher alone gave 21-24
 * over blocks of 2048 columns and 14-17 over 8192, where 8 KiB ahead into L2 gave 18
 * (docs/benchmarks.md). A call's mode never changes its results: only its speed. */
#include "kn.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Calls of each mode a shape is timed over before the median decides. */
#define PF_SAMPLES 12
/* Shapes a thread tunes; the calls of shapes beyond use KN_PF_DEFAULT. */
#define PF_SHAPES 16
/* The mode of calls before a shape is tuned (and of shapes beyond PF_SHAPES), and of a tie. The
 * mode with the lowest median wins, by however little: a rule that kept L2 unless another mode
 * was 5% faster chose L2 for qwen3-1.7b's FFN down (K = 6144) and head where the hardware
 * prefetcher alone was 4% faster; between near-equal modes a wrong pick costs as little. */
#define KN_PF_DEFAULT KN_PF_L2

static const char *const pf_names[KN_PF_COUNT] = {"hw", "l1", "l2"};

struct pf_shape {
    int dtype, rows, cols;
    int chosen; /* a mode, or -1 while tuning */
    int calls;  /* timed so far; call i runs mode i % KN_PF_COUNT */
    uint32_t ns[KN_PF_COUNT][PF_SAMPLES];
};

/* A thread's shapes, and its first pass over the weights, whose calls are not timed: they fault
 * the pages into this process (qwen3-1.7b decode at 1 thread: 20x a warm call's time, which
 * left the choice to noise and gave 21 tok/s where the hardware prefetcher alone gave 25). The
 * pass ends when the thread's first matrix comes again after another: the next token, or the
 * next round of a benchmark's copies (or after PF_PASS_CALLS calls). A pointer, not a shape: pool
 * threads take chunks of a matrix in no fixed order. */
static __thread struct {
    struct pf_shape s[PF_SHAPES];
    int n;
    const void *first;     /* the codes of the thread's first call */
    bool seen, left, warm; /* seen a call; one on another matrix since; the pass is over */
    int calls;             /* calls of the pass so far */
} pf_tab;
/* Calls after which a first pass is over though the first matrix never came again (a thread
 * that only ever reads one): more than a token of a large model's chunks on one thread. */
#define PF_PASS_CALLS 65536

/* This thread's forced mode (kn_pf_force), -1: tuned. Per thread as the tuner's state is: the
 * owner of a thread (the worker, for each member of its pool) says what it runs. */
static __thread int pf_forced = -1;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

const char *kn_pf_name(int mode) { return mode >= 0 && mode < KN_PF_COUNT ? pf_names[mode] : "?"; }

int kn_pf_parse(const char *name)
{
    if (!strcmp(name, "auto"))
        return -1;
    for (int m = 0; m < KN_PF_COUNT; m++)
        if (!strcmp(name, pf_names[m]))
            return m;
    return -2;
}

void kn_pf_force(int mode) { pf_forced = mode >= 0 && mode < KN_PF_COUNT ? mode : -1; }

static struct pf_shape *pf_lookup(int dtype, int rows, int cols)
{
    for (int i = 0; i < pf_tab.n; i++)
        if (pf_tab.s[i].dtype == dtype && pf_tab.s[i].rows == rows && pf_tab.s[i].cols == cols)
            return &pf_tab.s[i];
    return NULL;
}

static struct pf_shape *pf_find(int dtype, int rows, int cols)
{
    struct pf_shape *s = pf_lookup(dtype, rows, cols);
    if (s)
        return s;
    if (pf_tab.n == PF_SHAPES)
        return NULL;
    s = &pf_tab.s[pf_tab.n++];
    memset(s, 0, sizeof(*s));
    s->dtype = dtype, s->rows = rows, s->cols = cols, s->chosen = -1;
    return s;
}

/* Whether the calling thread's first pass over the weights is over (pf_tab), counting a call on
 * @codes. */
static bool pf_warm(const void *codes)
{
    if (!pf_tab.warm) {
        if (!pf_tab.seen)
            pf_tab.seen = true, pf_tab.first = codes;
        else if (codes != pf_tab.first)
            pf_tab.left = true;
        else
            pf_tab.warm = pf_tab.left;
        pf_tab.warm |= ++pf_tab.calls > PF_PASS_CALLS;
    }
    return pf_tab.warm;
}

int kn_pf_begin(struct kn_pf_call *c, const struct kn_mat *w, int rows)
{
    int forced = pf_forced;
    c->shape = NULL;
    if (forced >= 0)
        return forced;
    struct pf_shape *s = pf_find(w->dtype, rows, w->cols);
    if (!s)
        return KN_PF_DEFAULT;
    if (s->chosen >= 0)
        return s->chosen;
    if (!pf_warm(w->codes))
        return KN_PF_DEFAULT;
    c->shape = s;
    c->t0 = now_ns();
    return s->calls % KN_PF_COUNT;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t median(uint32_t *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_u32);
    return v[n / 2];
}

void kn_pf_end(struct kn_pf_call *c)
{
    struct pf_shape *s = c->shape;
    if (!s)
        return;
    uint64_t dt = now_ns() - c->t0;
    s->ns[s->calls % KN_PF_COUNT][s->calls / KN_PF_COUNT] =
        dt > UINT32_MAX ? UINT32_MAX : (uint32_t)dt;
    if (++s->calls < KN_PF_COUNT * PF_SAMPLES)
        return;
    uint32_t med[KN_PF_COUNT];
    for (int m = 0; m < KN_PF_COUNT; m++)
        med[m] = median(s->ns[m], PF_SAMPLES);
    s->chosen = kn_pf_decide(med);
}

int kn_pf_decide(const uint32_t *med)
{
    int best = KN_PF_DEFAULT;
    for (int m = 0; m < KN_PF_COUNT; m++)
        if (med[m] < med[best])
            best = m;
    return best;
}

int kn_pf_chosen(const struct kn_mat *w, int rows)
{
    const struct pf_shape *s = pf_lookup(w->dtype, rows, w->cols);
    return s ? s->chosen : -1;
}

void kn_pf_reset(void) { memset(&pf_tab, 0, sizeof(pf_tab)); }
