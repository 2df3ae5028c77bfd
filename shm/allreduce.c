/* SPDX-License-Identifier: MIT */
/* shm/allreduce.c: all-reduce and barrier among the worker processes of one tensor-parallel group.
 *
 * The area lives in memory shared by several processes, so every counter is a plain 32-bit word
 * used only through __atomic builtins, and the futex calls are shared ones (no
 * FUTEX_PRIVATE_FLAG: a private futex is keyed by the process's own address space and would never
 * wake a sleeper in another process).
 *
 * Barrier (generation counting): an arrival reads the generation, then adds one to `arrived`
 * (release: its slot writes are published with it). The last arrival resets `arrived`, bumps the
 * generation (release, after acquiring every other arrival through the read-modify-writes on
 * `arrived`) and wakes the sleepers; the others wait until the generation differs from the one
 * they read (acquire), so every slot written before the barrier is visible after it. A waiter
 * spins briefly, then sleeps on the generation word in slices of AR_SLICE_NS, checking the abort
 * flag, its peers' pids and its timeout on each wake-up.
 *
 * Failure is final: once a wait has failed, `arrived` counts a rank that has left, so the
 * counters can no longer be trusted. The rank that fails therefore sets the abort flag itself
 * (and wakes everyone), and from then on every wait of every rank returns -ECONNABORTED at once.
 * The coordinator tears the group down (new workers, a fresh area); nothing ever resets the flag.
 */
#include "allreduce.h"
#include "common.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define AR_MAGIC 0x52414853u /* "SHAR" */
#define AR_LINE 64
/* Spins before sleeping: a few thousand PAUSEs, ~100-500 us (PAUSE is ~140 cycles on
 * Skylake-SP and later, ~10-65 on AMD Zen); long enough to cover a balanced step, short enough
 * not to burn an oversubscribed core for long. */
#define AR_SPINS 4000
/* Longest futex sleep between checks of the abort flag, the peers and the timeout. */
#define AR_SLICE_NS (20 * 1000000ull)
#define AR_DEFAULT_TIMEOUT_MS 30000

/* The start of the area; the slots follow at sizeof(struct ar_hdr). Each group of fields that is
 * written at a different rate has its own cache line. */
struct ar_hdr {
    uint32_t magic; /* AR_MAGIC, written last by seg_ar_init */
    uint32_t n_ranks;
    uint64_t max_floats;
    uint64_t slot_bytes; /* max_floats * 4 rounded up to AR_LINE */
    uint64_t bytes;      /* the whole area: seg_ar_bytes(n_ranks, max_floats) */
    /* written by every arrival */
    _Alignas(AR_LINE) uint32_t arrived;
    uint32_t sleepers; /* waiters inside the futex path: the last arrival skips FUTEX_WAKE at 0 */
    /* written once per barrier, polled by the waiters */
    _Alignas(AR_LINE) uint32_t generation;
    uint32_t abort; /* set (never cleared) by seg_ar_abort or by a rank whose wait failed */
    /* written once per rank by seg_ar_attach; 0 = not registered yet */
    _Alignas(AR_LINE) pid_t pids[SEG_AR_MAX_RANKS];
};
_Static_assert(sizeof(struct ar_hdr) == 3 * AR_LINE + SEG_AR_MAX_RANKS * sizeof(pid_t),
               "struct ar_hdr: unexpected padding");
_Static_assert(sizeof(struct ar_hdr) % AR_LINE == 0, "slots must start on a cache line");

/* A broken invariant of the caller (a bad rank, n past max_floats): print and abort. */
_Noreturn static void ar_assert_fail(const char *what, int line)
{
    fprintf(stderr, "shm/allreduce.c:%d: assertion failed: %s\n", line, what);
    abort();
}
#define AR_ASSERT(c)                                                                               \
    do {                                                                                           \
        if (!(c))                                                                                  \
            ar_assert_fail(#c, __LINE__);                                                          \
    } while (0)

static inline void ar_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Shared futexes (see the top of the file). Errors are not needed: every wake-up rechecks. */
static void ar_futex_wait(uint32_t *addr, uint32_t val, uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void ar_futex_wake(uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Bytes of one slot of @max_floats floats, or 0 on overflow. */
static size_t ar_slot_bytes(size_t max_floats)
{
    if (max_floats > (SIZE_MAX - AR_LINE) / sizeof(float))
        return 0;
    return (max_floats * sizeof(float) + AR_LINE - 1) / AR_LINE * AR_LINE;
}

/* Returns the bytes the area needs, a multiple of 64; 0 when @n_ranks is outside
 * 1..SEG_AR_MAX_RANKS or the size does not fit in a size_t. */
size_t seg_ar_bytes(int n_ranks, size_t max_floats)
{
    if (n_ranks < 1 || n_ranks > SEG_AR_MAX_RANKS)
        return 0;
    size_t slot = ar_slot_bytes(max_floats), slots;
    if (max_floats && !slot)
        return 0;
    if (__builtin_mul_overflow(slot, (size_t)2 * (size_t)n_ranks, &slots) ||
        slots > SIZE_MAX - sizeof(struct ar_hdr))
        return 0;
    return sizeof(struct ar_hdr) + slots;
}

/* Writes the header (counters, abort flag and pids cleared, so a used area with no rank attached
 * may be initialized again); the magic is stored last (release), so a worker that sees it sees
 * the rest. The slots are not touched. Bad arguments are a caller's bug and abort. */
void seg_ar_init(void *area, int n_ranks, size_t max_floats)
{
    struct ar_hdr *h = area;
    size_t bytes = seg_ar_bytes(n_ranks, max_floats);
    AR_ASSERT(bytes != 0);
    AR_ASSERT((uintptr_t)area % AR_LINE == 0);
    memset(h, 0, sizeof(*h));
    h->n_ranks = (uint32_t)n_ranks;
    h->max_floats = max_floats;
    h->slot_bytes = ar_slot_bytes(max_floats);
    h->bytes = bytes;
    __atomic_store_n(&h->magic, AR_MAGIC, __ATOMIC_RELEASE);
}

/* Checks that the area of @bytes bytes at @area was initialized for @n_ranks and @max_floats:
 * 0 or -EINVAL. */
int seg_ar_check(const void *area, size_t bytes, int n_ranks, size_t max_floats)
{
    const struct ar_hdr *h = area;
    size_t want = seg_ar_bytes(n_ranks, max_floats);
    if (!area || (uintptr_t)area % AR_LINE || !want || bytes != want)
        return -EINVAL;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != AR_MAGIC ||
        h->n_ranks != (uint32_t)n_ranks || h->max_floats != max_floats ||
        h->slot_bytes != ar_slot_bytes(max_floats) || h->bytes != want)
        return -EINVAL;
    return 0;
}

/* Attaches @r as rank @rank of @area (checked with seg_ar_check) and registers @pid for the
 * dead-peer checks. The handle owns nothing: there is nothing to release. */
void seg_ar_attach(struct seg_ar_rank *r, void *area, int rank, pid_t pid)
{
    struct ar_hdr *h = area;
    AR_ASSERT(__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == AR_MAGIC);
    AR_ASSERT(rank >= 0 && (uint32_t)rank < h->n_ranks);
    memset(r, 0, sizeof(*r));
    r->area = area;
    r->rank = rank;
    r->n_ranks = (int)h->n_ranks;
    r->timeout_ms = AR_DEFAULT_TIMEOUT_MS;
    __atomic_store_n(&h->pids[rank], pid, __ATOMIC_RELEASE);
}

/* Sets the abort flag and wakes every sleeper; a waiter between its last check and its futex
 * call sees the flag at its next wake-up, at most AR_SLICE_NS later. */
void seg_ar_abort(void *area)
{
    struct ar_hdr *h = area;
    __atomic_store_n(&h->abort, 1, __ATOMIC_SEQ_CST);
    ar_futex_wake(&h->generation);
}

/* Whether every registered peer of @r still exists. A zombie counts as alive until its parent
 * reaps it, and a recycled pid as well (the timeout still catches that). */
static bool ar_peers_alive(const struct ar_hdr *h, const struct seg_ar_rank *r)
{
    for (int i = 0; i < r->n_ranks; i++) {
        pid_t pid = __atomic_load_n(&h->pids[i], __ATOMIC_ACQUIRE);
        if (i == r->rank || pid <= 0)
            continue;
        if (kill(pid, 0) < 0 && errno != EPERM)
            return false;
    }
    return true;
}

/* The slow path of a wait: sleeps on the generation until it differs from @gen. Returns 0,
 * -ECONNABORTED (abort flag, or a peer is gone) or -ETIMEDOUT (no progress for timeout_ms; 0 or
 * less waits for ever). On failure it poisons the area (see the top of the file). */
static int ar_sleep(struct seg_ar_rank *r, uint32_t gen)
{
    struct ar_hdr *h = r->area;
    uint64_t start = shardlm_now_ns();
    uint64_t limit = r->timeout_ms > 0 ? (uint64_t)r->timeout_ms * 1000000ull : UINT64_MAX;
    int rc;
    bool slept = false; /* the peers are checked from the first wake-up on, not before */
    /* Dekker with the last arrival: it bumps the generation then reads `sleepers`, we raise
     * `sleepers` then read the generation (both seq_cst), so either it wakes us or we see the
     * new generation; FUTEX_WAIT rechecks the word under the futex lock. */
    __atomic_add_fetch(&h->sleepers, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        if (__atomic_load_n(&h->generation, __ATOMIC_SEQ_CST) != gen) {
            rc = 0;
            break;
        }
        if (__atomic_load_n(&h->abort, __ATOMIC_ACQUIRE) || (slept && !ar_peers_alive(h, r))) {
            rc = -ECONNABORTED;
            break;
        }
        uint64_t waited = shardlm_now_ns() - start;
        if (waited >= limit) {
            rc = -ETIMEDOUT;
            break;
        }
        uint64_t slice = limit - waited < AR_SLICE_NS ? limit - waited : AR_SLICE_NS;
        ar_futex_wait(&h->generation, gen, slice);
        slept = true;
    }
    __atomic_sub_fetch(&h->sleepers, 1, __ATOMIC_RELAXED);
    if (rc)
        seg_ar_abort(h);
    return rc;
}

/* One barrier among the n_ranks ranks of @r (n_ranks > 1). Returns 0, -ECONNABORTED or
 * -ETIMEDOUT; after a failure the area is poisoned. */
static int ar_wait(struct seg_ar_rank *r)
{
    struct ar_hdr *h = r->area;
    if (__atomic_load_n(&h->abort, __ATOMIC_ACQUIRE))
        return -ECONNABORTED;
    /* read before arriving: the barrier cannot complete (and move it) without us */
    uint32_t gen = __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&h->arrived, 1, __ATOMIC_ACQ_REL) == (uint32_t)r->n_ranks) {
        /* ordered before the next arrivals by the release of the generation below */
        __atomic_store_n(&h->arrived, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&h->generation, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->sleepers, __ATOMIC_SEQ_CST))
            ar_futex_wake(&h->generation);
        return 0;
    }
    for (int i = 0; i < AR_SPINS; i++) {
        if (__atomic_load_n(&h->generation, __ATOMIC_ACQUIRE) != gen)
            return 0;
        ar_cpu_relax();
    }
    return ar_sleep(r, gen);
}

static inline float *ar_slot(struct ar_hdr *h, unsigned parity, int rank)
{
    return (float *)((char *)h + sizeof(*h) +
                     ((size_t)parity * h->n_ranks + (size_t)rank) * h->slot_bytes);
}

/* out = a + b and out += a, 16 floats a step in GCC vector types (SSE on x86-64 without any
 * -m flag, NEON on arm64): at -O2, GCC 12's very-cheap cost model leaves the plain loop scalar,
 * and 2 ranks x 2048 floats took 1.2 us that way against 0.74 us vectorized (Zen 5 VM, min of 7).
 * Each element still gets the same single IEEE addition, so results do not change. */
typedef float ar_v4 __attribute__((vector_size(16), aligned(4), may_alias)); /* unaligned */

static void ar_add2(float *restrict out, const float *restrict a, const float *restrict b,
                    size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const ar_v4 *va = (const ar_v4 *)(a + i), *vb = (const ar_v4 *)(b + i);
        ar_v4 *vo = (ar_v4 *)(out + i);
        vo[0] = va[0] + vb[0];
        vo[1] = va[1] + vb[1];
        vo[2] = va[2] + vb[2];
        vo[3] = va[3] + vb[3];
    }
    for (; i < n; i++)
        out[i] = a[i] + b[i];
}

static void ar_add(float *restrict out, const float *restrict a, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const ar_v4 *va = (const ar_v4 *)(a + i);
        ar_v4 *vo = (ar_v4 *)(out + i);
        vo[0] += va[0];
        vo[1] += va[1];
        vo[2] += va[2];
        vo[3] += va[3];
    }
    for (; i < n; i++)
        out[i] += a[i];
}

/* Publishes @buf in this rank's slot of the current parity, waits for everyone, and sums the
 * slots in rank order 0..n_ranks-1, so that every rank computes the same float additions in the
 * same order and gets bit-identical results. Returns 0, -ECONNABORTED or -ETIMEDOUT; on failure
 * @buf is left as it was. */
int seg_ar_allreduce(struct seg_ar_rank *r, float *buf, size_t n)
{
    if (r->n_ranks == 1)
        return 0;
    struct ar_hdr *h = r->area;
    AR_ASSERT(n <= h->max_floats);
    uint64_t t0 = shardlm_now_ns();
    unsigned parity = (unsigned)(r->calls++ & 1);
    memcpy(ar_slot(h, parity, r->rank), buf, n * sizeof(float));
    int rc = ar_wait(r);
    if (rc == 0 && n) {
        ar_add2(buf, ar_slot(h, parity, 0), ar_slot(h, parity, 1), n);
        for (int i = 2; i < r->n_ranks; i++)
            ar_add(buf, ar_slot(h, parity, i), n);
    }
    r->wait_ns += shardlm_now_ns() - t0;
    return rc;
}

/* A barrier of all ranks; same returns as seg_ar_allreduce. It may be mixed freely with
 * all-reduces: the parity argument only needs some barrier between two uses of one slot. */
int seg_ar_barrier(struct seg_ar_rank *r)
{
    if (r->n_ranks == 1)
        return 0;
    uint64_t t0 = shardlm_now_ns();
    int rc = ar_wait(r);
    r->wait_ns += shardlm_now_ns() - t0;
    return rc;
}

uint64_t seg_ar_take_wait_ns(struct seg_ar_rank *r)
{
    uint64_t ns = r->wait_ns;
    r->wait_ns = 0;
    return ns;
}
