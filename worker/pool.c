/* SPDX-License-Identifier: MIT */
/* worker/pool.c: the thread pool - members pinned one per CPU, jobs handed over through atomics. */
#include "pool.h"

#include <errno.h>
#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPIN 20000 /* pause loops before sleeping: a decode step issues jobs back to back */

struct wrk_pool {
    int n;
    pthread_t *threads;
    _Atomic uint32_t generation; /* bumped per job; members wait for it to change */
    _Atomic int pending;         /* members still working on the current job */
    _Atomic int stop;
    _Atomic int sleepers;      /* members inside futex_wait: the runner wakes only if any */
    _Atomic int caller_asleep; /* the runner inside futex_wait on pending */
    void (*fn)(void *, int, int);
    void *arg;
};

struct member {
    struct wrk_pool *p;
    int i, cpu;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void *member_main(void *arg)
{
    struct member m = *(struct member *)arg;
    free(arg);
    struct wrk_pool *p = m.p;
    pin(m.cpu);
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        for (int s = 0; (g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen;
             s++) {
            if (s < SPIN) {
                _mm_pause();
            } else {
                /* seq_cst: either the runner sees us counted, or we see its new generation */
                atomic_fetch_add(&p->sleepers, 1);
                futex_wait(&p->generation, seen);
                atomic_fetch_sub(&p->sleepers, 1);
            }
        }
        seen = g;
        if (atomic_load(&p->stop))
            return NULL;
        p->fn(p->arg, m.i, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_asleep))
            futex_wake((_Atomic uint32_t *)&p->pending);
    }
}

int wrk_pool_init(struct wrk_pool **out, int n, const int *cpus)
{
    struct wrk_pool *p = calloc(1, sizeof(*p));
    if (!p || n < 1) {
        free(p);
        return -EINVAL;
    }
    p->n = n;
    p->threads = calloc((size_t)n, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return -ENOMEM;
    }
    pin(cpus ? cpus[0] : -1);
    for (int i = 1; i < n; i++) {
        struct member *m = malloc(sizeof(*m));
        if (!m) {
            p->n = i;
            wrk_pool_free(p);
            return -ENOMEM;
        }
        *m = (struct member){p, i, cpus ? cpus[i] : -1};
        int rc = pthread_create(&p->threads[i], NULL, member_main, m);
        if (rc) {
            free(m);
            p->n = i;
            wrk_pool_free(p);
            return -rc;
        }
    }
    *out = p;
    return 0;
}

void wrk_pool_free(struct wrk_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    futex_wake(&p->generation);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int wrk_pool_size(const struct wrk_pool *p) { return p->n; }

static void par_run(void *pool, void (*fn)(void *, int, int), void *arg)
{
    wrk_pool_run(pool, fn, arg);
}

struct kn_par wrk_pool_par(struct wrk_pool *p) { return (struct kn_par){par_run, p}; }

void wrk_pool_run(struct wrk_pool *p, void (*fn)(void *, int, int), void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers))
        futex_wake(&p->generation);
    fn(arg, 0, p->n);
    int left;
    for (int s = 0; (left = atomic_load(&p->pending)) != 0; s++) {
        if (s < SPIN) {
            _mm_pause();
        } else {
            atomic_store(&p->caller_asleep, 1);
            futex_wait((_Atomic uint32_t *)&p->pending, (uint32_t)left);
            atomic_store(&p->caller_asleep, 0);
        }
    }
}
