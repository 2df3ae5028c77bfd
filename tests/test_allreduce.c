/* SPDX-License-Identifier: MIT */
/* shm/allreduce: the all-reduce and barrier of a tensor-parallel group, run by forked processes
 * over a shared anonymous mapping: exact sums with 2, 3 and 4 ranks on ragged lengths,
 * bit-identical results on every rank, abort, a dead peer, a timeout, and the checks of a mapped
 * area.
 *
 * Children never use cmocka's asserts (a failed one would longjmp into the child's copy of the
 * runner): they check by hand, print what went wrong and _exit(1), or leave their findings in
 * shared memory; the parent asserts on those and on the exit codes. With more ranks than CPUs
 * (3 and 4 ranks on a 2-core machine) the barriers go through the futex path, which is slower,
 * so those cases run fewer iterations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sched.h>
#include <sys/mman.h>

#include "allreduce.h"
#include "testutil.h"

#define MAXF 4099 /* max_floats: not a multiple of 16, so the last slot line is padded */
#define TAIL_MARK 12345.0f /* written past n: an all-reduce of n floats must not touch it */
#define MS 1000000ull

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int n_cpus(void)
{
    cpu_set_t s;
    if (sched_getaffinity(0, sizeof(s), &s))
        return 1;
    return CPU_COUNT(&s);
}

/* A zeroed MAP_SHARED | MAP_ANONYMOUS mapping, inherited by the children forked after it. */
static void *map_shared(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

/* A fresh area of @n_ranks ranks and MAXF floats in shared memory; *@bytes gets its size. */
static void *new_area(int n_ranks, size_t *bytes)
{
    *bytes = seg_ar_bytes(n_ranks, MAXF);
    assert_true(*bytes > 0);
    void *area = map_shared(*bytes);
    seg_ar_init(area, n_ranks, MAXF);
    assert_int_equal(seg_ar_check(area, *bytes, n_ranks, MAXF), 0);
    return area;
}

typedef int (*child_fn)(int rank, void *arg);

/* Forks @n children; child i runs fn(i, arg) and exits with what it returns. */
static void spawn(pid_t *pids, int n, child_fn fn, void *arg)
{
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            _exit(fn(i, arg));
        pids[i] = pid;
    }
}

/* Reaps the @n children of @pids as soon as each exits (so that a dead one is not left as a
 * zombie, which still counts as alive), for at most @timeout_ms in all; kills the rest then.
 * Returns how many did not exit with status 0. */
static int reap(const pid_t *pids, int n, int timeout_ms)
{
    bool done[SEG_AR_MAX_RANKS] = {false};
    uint64_t end = now_ns() + (uint64_t)timeout_ms * MS;
    int left = n, bad = 0;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            int st;
            if (done[i] || waitpid(pids[i], &st, WNOHANG) != pids[i])
                continue;
            done[i] = true;
            left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "child %d: %s %d\n", i, WIFEXITED(st) ? "exit" : "signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                bad++;
            }
        }
        if (left > 0 && now_ns() > end) {
            for (int i = 0; i < n; i++)
                if (!done[i]) {
                    fprintf(stderr, "child %d: still running after %d ms, killed\n", i,
                            timeout_ms);
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    bad++;
                }
            break;
        }
        if (left > 0)
            usleep(1000);
    }
    return bad;
}

/* Busy-waits @us microseconds: makes one rank late without leaving the CPU. */
static void spin_us(unsigned us)
{
    uint64_t end = now_ns() + (uint64_t)us * 1000;
    while (now_ns() < end)
        ;
}

/* ---- exact sums ---- */

/* A small integer, different per rank, call and element; sums of a few stay exact in float. */
static int exact_val(int rank, int it, size_t i)
{
    return ((int)((i * 7 + (size_t)it * 13 + (size_t)rank * 5) % 61) - 30) * (rank + 1);
}

struct exact_ctx {
    void *area;
    int n_ranks, iters;
};

static const size_t exact_sizes[] = {1, 64, 172, 2048, MAXF, 0};
#define N_EXACT_SIZES (sizeof(exact_sizes) / sizeof(exact_sizes[0]))

/* One rank: for each size, iters all-reduces with every result checked, a barrier now and then,
 * and one rank made late in turn, so that ranks run at different places of the double buffer. */
static int child_exact(int rank, void *arg)
{
    const struct exact_ctx *c = arg;
    struct seg_ar_rank r;
    if (seg_ar_check(c->area, seg_ar_bytes(c->n_ranks, MAXF), c->n_ranks, MAXF)) {
        fprintf(stderr, "rank %d: seg_ar_check failed\n", rank);
        return 1;
    }
    seg_ar_attach(&r, c->area, rank, getpid());
    if (r.rank != rank || r.n_ranks != c->n_ranks || r.calls != 0 || r.timeout_ms != 30000) {
        fprintf(stderr, "rank %d: seg_ar_attach left a wrong handle\n", rank);
        return 1;
    }
    float *buf = malloc((MAXF + 16) * sizeof(float));
    if (!buf)
        return 1;
    uint64_t calls = 0;
    int rc = 1;
    for (size_t s = 0; s < N_EXACT_SIZES; s++) {
        size_t n = exact_sizes[s];
        for (int it = 0; it < c->iters; it++) {
            for (size_t i = 0; i < n; i++)
                buf[i] = (float)exact_val(rank, it, i);
            for (size_t i = n; i < MAXF + 16; i++)
                buf[i] = TAIL_MARK;
            if (it % 37 == rank)
                spin_us(30);
            int e = seg_ar_allreduce(&r, buf, n);
            calls++;
            if (e) {
                fprintf(stderr, "rank %d: n=%zu call %d: %s\n", rank, n, it, strerror(-e));
                goto out_free;
            }
            for (size_t i = 0; i < n; i++) {
                int want = 0;
                for (int k = 0; k < c->n_ranks; k++)
                    want += exact_val(k, it, i);
                if (buf[i] != (float)want) {
                    fprintf(stderr, "rank %d: n=%zu call %d: [%zu] = %g, expected %d\n", rank, n,
                            it, i, (double)buf[i], want);
                    goto out_free;
                }
            }
            for (size_t i = n; i < MAXF + 16; i++)
                if (buf[i] != TAIL_MARK) {
                    fprintf(stderr, "rank %d: n=%zu: wrote past n at %zu\n", rank, n, i);
                    goto out_free;
                }
            if (it % 100 == 99 && (e = seg_ar_barrier(&r))) {
                fprintf(stderr, "rank %d: barrier: %s\n", rank, strerror(-e));
                goto out_free;
            }
        }
    }
    if (r.calls != calls) {
        fprintf(stderr, "rank %d: calls = %llu, expected %llu\n", rank,
                (unsigned long long)r.calls, (unsigned long long)calls);
        goto out_free;
    }
    if (seg_ar_take_wait_ns(&r) == 0 || seg_ar_take_wait_ns(&r) != 0) {
        fprintf(stderr, "rank %d: seg_ar_take_wait_ns does not count or does not reset\n", rank);
        goto out_free;
    }
    rc = 0;
out_free:
    free(buf);
    return rc;
}

static void run_exact(int n_ranks)
{
    size_t bytes;
    void *area = new_area(n_ranks, &bytes);
    /* oversubscribed, every barrier costs context switches: fewer calls */
    struct exact_ctx c = {area, n_ranks, n_ranks <= n_cpus() ? 2000 : 500};
    pid_t pids[SEG_AR_MAX_RANKS];
    uint64_t t0 = now_ns();
    spawn(pids, n_ranks, child_exact, &c);
    assert_int_equal(reap(pids, n_ranks, 60000), 0);
    print_message("ranks=%d: %d x %zu all-reduces in %.0f ms\n", n_ranks, c.iters,
                  N_EXACT_SIZES, (double)(now_ns() - t0) / 1e6);
    munmap(area, bytes);
}

static void test_exact_2(void **state) { run_exact(2); }
static void test_exact_3(void **state) { run_exact(3); }
static void test_exact_4(void **state) { run_exact(4); }

/* ---- bit-identical results ---- */

#define BIT_RANKS 4
#define BIT_ITERS 100

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A non-integer value spread over 24 binades, so that the order of the additions matters. */
static float rnd_val(int rank, int it, size_t i)
{
    uint64_t x = mix64(((uint64_t)rank << 48) ^ ((uint64_t)it << 24) ^ i);
    float m = (float)(x >> 40) / 16777216.0f - 0.5f;
    return m * (float)(1u << (x & 15)) / 256.0f;
}

static uint64_t fnv(uint64_t h, const float *v, size_t n)
{
    const uint8_t *p = (const uint8_t *)v;
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static const size_t bit_sizes[] = {172, 2048};

struct bit_ctx {
    void *area;
    uint64_t hash[BIT_RANKS]; /* in shared memory: each rank's hash of all its results */
};

static int child_bits(int rank, void *arg)
{
    struct bit_ctx *c = arg;
    struct seg_ar_rank r;
    seg_ar_attach(&r, c->area, rank, getpid());
    float *buf = malloc(MAXF * sizeof(float));
    if (!buf)
        return 1;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t s = 0; s < sizeof(bit_sizes) / sizeof(bit_sizes[0]); s++)
        for (int it = 0; it < BIT_ITERS; it++) {
            size_t n = bit_sizes[s];
            for (size_t i = 0; i < n; i++)
                buf[i] = rnd_val(rank, it, i);
            int e = seg_ar_allreduce(&r, buf, n);
            if (e) {
                fprintf(stderr, "rank %d: %s\n", rank, strerror(-e));
                free(buf);
                return 1;
            }
            h = fnv(h, buf, n);
        }
    free(buf);
    c->hash[rank] = h;
    return 0;
}

/* The hash the ranks must all get: the sums in rank order (or reversed, to show that the order
 * is visible in these values). */
static uint64_t bits_reference(bool reversed)
{
    float *sum = malloc(MAXF * sizeof(float));
    assert_non_null(sum);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t s = 0; s < sizeof(bit_sizes) / sizeof(bit_sizes[0]); s++)
        for (int it = 0; it < BIT_ITERS; it++) {
            size_t n = bit_sizes[s];
            for (size_t i = 0; i < n; i++) {
                float acc = rnd_val(reversed ? BIT_RANKS - 1 : 0, it, i);
                for (int k = 1; k < BIT_RANKS; k++)
                    acc += rnd_val(reversed ? BIT_RANKS - 1 - k : k, it, i);
                sum[i] = acc;
            }
            h = fnv(h, sum, n);
        }
    free(sum);
    return h;
}

static void test_bit_identical(void **state)
{
    size_t bytes;
    void *area = new_area(BIT_RANKS, &bytes);
    struct bit_ctx *c = map_shared(sizeof(*c));
    c->area = area;
    pid_t pids[BIT_RANKS];
    spawn(pids, BIT_RANKS, child_bits, c);
    assert_int_equal(reap(pids, BIT_RANKS, 30000), 0);
    uint64_t want = bits_reference(false);
    assert_true(want != bits_reference(true));
    for (int k = 0; k < BIT_RANKS; k++)
        assert_true(c->hash[k] == want);
    munmap(c, sizeof(*c));
    munmap(area, bytes);
}

/* ---- one rank ---- */

static void test_one_rank(void **state)
{
    size_t bytes;
    void *area = new_area(1, &bytes);
    struct seg_ar_rank r;
    seg_ar_attach(&r, area, 0, getpid());
    float buf[3] = {1.5f, -2.0f, 3.25f};
    assert_int_equal(seg_ar_allreduce(&r, buf, 3), 0);
    assert_true(buf[0] == 1.5f && buf[1] == -2.0f && buf[2] == 3.25f);
    assert_int_equal(seg_ar_barrier(&r), 0);
    assert_int_equal(seg_ar_take_wait_ns(&r), 0);
    munmap(area, bytes);
}

/* ---- failures ---- */

struct fail_ctx {
    void *area;
    int n_ranks;
    int timeout_ms;
    int entered[SEG_AR_MAX_RANKS];      /* the rank is about to wait */
    int rc[SEG_AR_MAX_RANKS];           /* what its wait returned */
    int rc_after[SEG_AR_MAX_RANKS];     /* what its next all-reduce returned */
    uint64_t t_enter[SEG_AR_MAX_RANKS]; /* CLOCK_MONOTONIC, comparable across processes */
    uint64_t t_return[SEG_AR_MAX_RANKS];
    uint64_t after_ns[SEG_AR_MAX_RANKS]; /* how long that next all-reduce took */
};

/* A rank that waits at one barrier, records how it ended, then tries one all-reduce, which must
 * fail at once: a failed group stays failed. */
static int child_wait_once(int rank, void *arg)
{
    struct fail_ctx *c = arg;
    struct seg_ar_rank r;
    seg_ar_attach(&r, c->area, rank, getpid());
    r.timeout_ms = c->timeout_ms;
    c->t_enter[rank] = now_ns();
    __atomic_store_n(&c->entered[rank], 1, __ATOMIC_RELEASE);
    c->rc[rank] = seg_ar_barrier(&r);
    c->t_return[rank] = now_ns();
    float x = 1.0f;
    uint64_t t0 = now_ns();
    c->rc_after[rank] = seg_ar_allreduce(&r, &x, 1);
    c->after_ns[rank] = now_ns() - t0;
    return x == 1.0f ? 0 : 1;
}

static struct fail_ctx *new_fail_ctx(int n_ranks, int timeout_ms, size_t *bytes)
{
    struct fail_ctx *c = map_shared(sizeof(*c));
    c->area = new_area(n_ranks, bytes);
    c->n_ranks = n_ranks;
    c->timeout_ms = timeout_ms;
    return c;
}

static void free_fail_ctx(struct fail_ctx *c, size_t bytes)
{
    munmap(c->area, bytes);
    munmap(c, sizeof(*c));
}

static void wait_entered(struct fail_ctx *c, int rank)
{
    uint64_t end = now_ns() + 10000 * MS;
    while (!__atomic_load_n(&c->entered[rank], __ATOMIC_ACQUIRE)) {
        assert_true(now_ns() < end);
        usleep(500);
    }
}

/* The parent is rank 1 (alive, registered, never arrives); the child sleeps at the barrier and
 * seg_ar_abort wakes it with -ECONNABORTED, long before its 10 s timeout. The bounds below are
 * that timeout's (and test_timeout's 200 ms) with room for a loaded host: the abort is seen at
 * the wake-up or at the next 20 ms slice (AR_SLICE_NS), and a failed group fails at once, so a
 * host would have to stall the child for a second, not be slow, to fail them. */
static void test_abort(void **state)
{
    size_t bytes;
    struct fail_ctx *c = new_fail_ctx(2, 10000, &bytes);
    struct seg_ar_rank me;
    seg_ar_attach(&me, c->area, 1, getpid());
    pid_t pid;
    spawn(&pid, 1, child_wait_once, c);
    wait_entered(c, 0);
    usleep(60 * 1000); /* past the spin: asleep on the futex */
    uint64_t t_abort = now_ns();
    seg_ar_abort(c->area);
    assert_int_equal(reap(&pid, 1, 5000), 0);
    assert_int_equal(c->rc[0], -ECONNABORTED);
    assert_true(c->t_return[0] > t_abort);
    print_message("abort: woken after %.2f ms\n", (double)(c->t_return[0] - t_abort) / 1e6);
    assert_true(c->t_return[0] - t_abort < 1000 * MS);
    assert_int_equal(c->rc_after[0], -ECONNABORTED);
    assert_true(c->after_ns[0] < 100 * MS);
    /* and the parent's own calls fail at once too */
    assert_int_equal(seg_ar_barrier(&me), -ECONNABORTED);
    float x = 2.0f;
    assert_int_equal(seg_ar_allreduce(&me, &x, 1), -ECONNABORTED);
    assert_true(x == 2.0f);
    free_fail_ctx(c, bytes);
}

/* Rank 1 of three registers, waits until the others are at the barrier, and exits without
 * arriving: both survivors return -ECONNABORTED well before their 10 s timeout. */
static int child_dead_peer(int rank, void *arg)
{
    struct fail_ctx *c = arg;
    if (rank != 1)
        return child_wait_once(rank, arg);
    struct seg_ar_rank r;
    seg_ar_attach(&r, c->area, rank, getpid());
    uint64_t end = now_ns() + 10000 * MS;
    while (!__atomic_load_n(&c->entered[0], __ATOMIC_ACQUIRE) ||
           !__atomic_load_n(&c->entered[2], __ATOMIC_ACQUIRE)) {
        if (now_ns() > end)
            return 1;
        usleep(500);
    }
    usleep(30 * 1000);
    return 0;
}

static void test_dead_peer(void **state)
{
    size_t bytes;
    struct fail_ctx *c = new_fail_ctx(3, 10000, &bytes);
    pid_t pids[3];
    spawn(pids, 3, child_dead_peer, c);
    assert_int_equal(reap(pids, 3, 8000), 0);
    for (int k = 0; k < 3; k += 2) {
        assert_int_equal(c->rc[k], -ECONNABORTED);
        uint64_t took = c->t_return[k] - c->t_enter[k];
        print_message("dead peer: rank %d gave up after %.1f ms\n", k, (double)took / 1e6);
        assert_true(took < 1000 * MS);
        assert_int_equal(c->rc_after[k], -ECONNABORTED);
    }
    free_fail_ctx(c, bytes);
}

/* The parent is rank 1: alive and registered, but never arrives. With timeout_ms = 200 the
 * child's barrier returns -ETIMEDOUT after 200 ms (not much later), and the group stays failed. */
static void test_timeout(void **state)
{
    size_t bytes;
    struct fail_ctx *c = new_fail_ctx(2, 200, &bytes);
    struct seg_ar_rank me;
    seg_ar_attach(&me, c->area, 1, getpid());
    pid_t pid;
    spawn(&pid, 1, child_wait_once, c);
    assert_int_equal(reap(&pid, 1, 5000), 0);
    assert_int_equal(c->rc[0], -ETIMEDOUT);
    uint64_t took = c->t_return[0] - c->t_enter[0];
    print_message("timeout: gave up after %.1f ms\n", (double)took / 1e6);
    assert_true(took >= 200 * MS);
    assert_true(took < 1000 * MS);
    assert_int_equal(c->rc_after[0], -ECONNABORTED);
    assert_true(c->after_ns[0] < 100 * MS); /* a group not kept failed waits out 200 ms again */
    assert_int_equal(seg_ar_barrier(&me), -ECONNABORTED);
    free_fail_ctx(c, bytes);
}

/* ---- sizes and checks ---- */

static void test_bytes(void **state)
{
    for (int n_ranks = 1; n_ranks <= SEG_AR_MAX_RANKS; n_ranks++) {
        size_t b0 = seg_ar_bytes(n_ranks, 0), b1 = seg_ar_bytes(n_ranks, 1);
        assert_true(b0 > 0 && b0 % 64 == 0);
        /* one cache line per slot for 1..16 floats, 2 parities x n_ranks slots */
        assert_int_equal(b1, b0 + 2 * (size_t)n_ranks * 64);
        assert_int_equal(seg_ar_bytes(n_ranks, 16), b1);
        assert_int_equal(seg_ar_bytes(n_ranks, 17), b1 + 2 * (size_t)n_ranks * 64);
        assert_int_equal(seg_ar_bytes(n_ranks, MAXF) % 64, 0);
        assert_int_equal(seg_ar_bytes(n_ranks, MAXF), b0 + 2 * (size_t)n_ranks * 16448);
    }
    assert_int_equal(seg_ar_bytes(0, 64), 0);
    assert_int_equal(seg_ar_bytes(-1, 64), 0);
    assert_int_equal(seg_ar_bytes(SEG_AR_MAX_RANKS + 1, 64), 0);
    assert_int_equal(seg_ar_bytes(2, SIZE_MAX / 4), 0);
    assert_int_equal(seg_ar_bytes(2, SIZE_MAX), 0);
    assert_int_equal(seg_ar_bytes(64, SIZE_MAX / 512), 0);
}

static void test_check(void **state)
{
    const int n_ranks = 2;
    const size_t maxf = 100;
    size_t bytes = seg_ar_bytes(n_ranks, maxf);
    uint8_t *mem = aligned_alloc(64, bytes + 64);
    assert_non_null(mem);
    memset(mem, 0, bytes + 64);
    /* a zeroed area has no magic yet */
    assert_int_equal(seg_ar_check(mem, bytes, n_ranks, maxf), -EINVAL);
    seg_ar_init(mem, n_ranks, maxf);
    assert_int_equal(seg_ar_check(mem, bytes, n_ranks, maxf), 0);
    /* the group size, the capacity and the size must all agree */
    assert_int_equal(seg_ar_check(mem, bytes, 3, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes, 1, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes, 0, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes, SEG_AR_MAX_RANKS + 1, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes, n_ranks, maxf - 1), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes, n_ranks, maxf + 1), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes - 64, n_ranks, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes + 64, n_ranks, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(mem, bytes - 1, n_ranks, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(mem, 0, n_ranks, maxf), -EINVAL);
    /* the same numbers, but the area of a group of 3 (a size the caller could be told) */
    assert_int_equal(seg_ar_check(mem, seg_ar_bytes(3, maxf), 3, maxf), -EINVAL);
    /* not on a cache line */
    assert_int_equal(seg_ar_check(mem + 4, bytes, n_ranks, maxf), -EINVAL);
    assert_int_equal(seg_ar_check(NULL, bytes, n_ranks, maxf), -EINVAL);
    /* a corrupt magic */
    mem[0] ^= 1;
    assert_int_equal(seg_ar_check(mem, bytes, n_ranks, maxf), -EINVAL);
    mem[0] ^= 1;
    assert_int_equal(seg_ar_check(mem, bytes, n_ranks, maxf), 0);
    /* an aborted area initialized again works again (a fresh group over the same memory) */
    struct seg_ar_rank r;
    seg_ar_attach(&r, mem, 0, getpid());
    seg_ar_abort(mem);
    assert_int_equal(seg_ar_barrier(&r), -ECONNABORTED);
    seg_ar_init(mem, n_ranks, maxf);
    assert_int_equal(seg_ar_check(mem, bytes, n_ranks, maxf), 0);
    seg_ar_attach(&r, mem, 0, getpid());
    struct seg_ar_rank absent; /* registered, alive (us), never arrives */
    seg_ar_attach(&absent, mem, 1, getpid());
    r.timeout_ms = 30;
    assert_int_equal(seg_ar_barrier(&r), -ETIMEDOUT); /* not aborted any more */
    free(mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_exact_2),
        cmocka_unit_test(test_exact_3),
        cmocka_unit_test(test_exact_4),
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_dead_peer),
        cmocka_unit_test(test_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
