/* SPDX-License-Identifier: MIT */
/* shm/seg: the private runtime directory, segment files (create, map, free, ENOSPC), the limit
 * on segment memory under creations from several threads at once, cleaning the files of dead
 * coordinators, and the exchange and KV segment layouts.
 *
 * Every test runs with the runtime directory (seg_rundir's path) in its own temporary folder, so
 * nothing touches /dev/shm/shardlm-<uid>. The ENOSPC test mounts a 1 MiB tmpfs and skips without
 * mount permission (CAP_SYS_ADMIN): run it as root outside an unprivileged container. The
 * threaded limit test is the one ThreadSanitizer (SHARDLM_TSAN, in .ci/run) checks for races. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/syscall.h>

#include "allreduce.h"
#include "seg.h"

#include "testutil.h"

struct fixture {
    char base[2048];   /* temporary folder, removed at teardown */
    char rundir[2100]; /* base/run: the runtime directory, not created by the fixture */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    tu_mkdtemp(f->base, sizeof(f->base), "seg");
    tu_path(f->rundir, sizeof(f->rundir), "%s/run", f->base);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    tu_rmdir(f->base);
    free(f);
    return 0;
}

/* Creates the runtime directory through seg_rundir() and returns its path. */
static const char *rundir(struct fixture *f)
{
    char out[PATH_MAX];
    assert_int_equal(seg_rundir(f->rundir, out, sizeof(out)), 0);
    assert_string_equal(out, f->rundir);
    return f->rundir;
}

static void touch(const char *dir, const char *name)
{
    char p[PATH_MAX];
    tu_path(p, sizeof(p), "%s/%s", dir, name);
    assert_int_equal(tu_write(p, "x", 1), 0);
}

static bool exists(const char *dir, const char *name)
{
    char p[PATH_MAX];
    tu_path(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void test_rundir_created_private(void **state)
{
    struct fixture *f = *state;
    struct stat st;
    assert_int_equal(stat(f->rundir, &st), -1); /* does not exist yet */
    mode_t old = umask(0); /* the mode must not depend on the caller's umask */
    const char *d = rundir(f);
    umask(old);
    assert_int_equal(stat(d, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0700);
    assert_int_equal(st.st_uid, getuid());
    /* a second call accepts the directory it made */
    rundir(f);
}

static void test_rundir_refuses_shared(void **state)
{
    struct fixture *f = *state;
    char out[PATH_MAX];
    assert_int_equal(mkdir(f->rundir, 0700), 0);
    assert_int_equal(chmod(f->rundir, 0755), 0);
    assert_int_equal(seg_rundir(f->rundir, out, sizeof(out)), -EPERM);
    assert_int_equal(chmod(f->rundir, 0710), 0); /* group search only is still not private */
    assert_int_equal(seg_rundir(f->rundir, out, sizeof(out)), -EPERM);
    assert_int_equal(chmod(f->rundir, 0700), 0);
    assert_int_equal(seg_rundir(f->rundir, out, sizeof(out)), 0);
    /* owned by someone else (only root can set that up; not in a user namespace without
     * uid 65534 mapped) */
    if (geteuid() == 0 && chown(f->rundir, 65534, 65534) == 0) {
        assert_int_equal(seg_rundir(f->rundir, out, sizeof(out)), -EPERM);
        assert_int_equal(chown(f->rundir, getuid(), getgid()), 0);
    }
    /* a file, not a directory */
    assert_int_equal(rmdir(f->rundir), 0);
    assert_int_equal(tu_write(f->rundir, "x", 1), 0);
    assert_int_equal(seg_rundir(f->rundir, out, sizeof(out)), -EPERM);
    /* a parent that does not exist */
    char deep[PATH_MAX];
    tu_path(deep, sizeof(deep), "%s/no/such", f->base);
    assert_int_equal(seg_rundir(deep, out, sizeof(out)), -ENOENT);
    /* the caller names it, or NULL the default; "" is a mistake, not a wish for the default */
    assert_int_equal(seg_rundir_path("", out, sizeof(out)), -EINVAL);
    assert_int_equal(seg_rundir_path(NULL, out, sizeof(out)), 0);
    char def[PATH_MAX];
    seg_rundir_default(def, sizeof(def));
    assert_string_equal(out, def);
}

static void test_create_map_free(void **state)
{
    struct fixture *f = *state;
    const char *d = rundir(f);
    char path[PATH_MAX];
    seg_path(path, sizeof(path), d, getpid(), "weights");
    char want[PATH_MAX];
    tu_path(want, sizeof(want), "%s/%d.weights", d, (int)getpid());
    assert_string_equal(path, want);

    struct seg a, b, c;
    const size_t size = 3 * 4096 + 123; /* not a page multiple */
    assert_int_equal(seg_create(&a, path, size), 0);
    assert_non_null(a.base);
    assert_int_equal(a.size, size);
    assert_true(a.owner);
    assert_string_equal(a.path, path);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_size, size);
    /* the blocks are allocated now, not on first touch */
    assert_true((size_t)st.st_blocks * 512 >= size);
    memset(a.base, 0xab, size);

    /* an existing path is refused and left alone */
    assert_int_equal(seg_create(&b, path, 4096), -EEXIST);
    assert_null(b.base);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, size);

    /* mapping checks the size exactly */
    assert_int_equal(seg_map(&b, path, size - 1, false), -EINVAL);
    assert_int_equal(seg_map(&b, path, size + 1, true), -EINVAL);
    assert_int_equal(seg_map(&b, path, 0, false), -EINVAL);
    assert_null(b.base);
    char missing[PATH_MAX];
    seg_path(missing, sizeof(missing), d, getpid(), "missing");
    assert_int_equal(seg_map(&b, missing, size, false), -ENOENT);

    /* a writable mapping shares the pages with the creator's */
    assert_int_equal(seg_map(&b, path, size, true), 0);
    assert_false(b.owner);
    assert_int_equal(((uint8_t *)b.base)[size - 1], 0xab);
    ((uint8_t *)b.base)[0] = 0x11;
    assert_int_equal(((uint8_t *)a.base)[0], 0x11);

    /* a read-only mapping sees the data and faults on a write (checked in a child) */
    assert_int_equal(seg_map(&c, path, size, false), 0);
    assert_int_equal(((uint8_t *)c.base)[1], 0xab);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        ((volatile uint8_t *)c.base)[1] = 0;
        _exit(0);
    }
    int wst;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFSIGNALED(wst));
    assert_int_equal(WTERMSIG(wst), SIGSEGV);
    assert_int_equal(((uint8_t *)a.base)[1], 0xab);

    /* in use while mapped or created: nobody gets the exclusive lock (shm purge's) until every
     * mapping and the creator are gone */
    int probe = open(path, O_RDONLY);
    assert_true(probe >= 0);
    assert_int_equal(flock(probe, LOCK_EX | LOCK_NB), -1);
    assert_int_equal(errno, EWOULDBLOCK);

    /* only the owner's seg_free unlinks */
    seg_free(&c);
    seg_free(&b);
    assert_null(b.base);
    assert_int_equal(flock(probe, LOCK_EX | LOCK_NB), -1); /* the creator still holds it */
    assert_int_equal(access(path, F_OK), 0);
    seg_free(&a);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(errno, ENOENT);
    assert_int_equal(flock(probe, LOCK_EX | LOCK_NB), 0);
    close(probe);

    /* safe on a zeroed struct, and twice */
    struct seg z = {0};
    seg_free(&z);
    seg_free(&a);
}

static void test_create_bad_size(void **state)
{
    struct fixture *f = *state;
    const char *d = rundir(f);
    char path[PATH_MAX];
    seg_path(path, sizeof(path), d, getpid(), "zero");
    struct seg s;
    assert_true(seg_create(&s, path, 0) < 0);
    assert_int_equal(tu_count_files(d), 0); /* nothing left behind */
}

/* The limit from 4 threads at once, as the load lanes reserve: each thread reserves pages of its
 * own lazy segment and creates whole segments until the limit refuses, and together they get
 * exactly the limit - no byte past it, none lost. Under ThreadSanitizer this is where a charge
 * that is not atomic shows as a data race. */
#define LIMIT_THREADS 4
#define LIMIT_PAGES 4000 /* the limit, in pages */
#define LIMIT_PAGE 4096u

struct limit_lane {
    pthread_t thread;
    struct seg_budget *budget;
    const char *dir;
    int id;
    int reserved, created; /* pages reserved, segments of two pages created */
    int unexpected;        /* an error other than -ENOSPC */
};

static void *limit_lane_run(void *arg)
{
    struct limit_lane *ln = arg;
    struct seg lazy, whole;
    char path[PATH_MAX], what[32];
    if (seg_create_in(&lazy, ln->budget, "limit", (size_t)LIMIT_PAGES * LIMIT_PAGE, -1,
                      SEG_ANON | SEG_LAZY)) {
        ln->unexpected = 1;
        return NULL;
    }
    bool full_r = false, full_c = false;
    for (int p = 0; !full_r || !full_c; p++) {
        if (!full_r) {
            int rc = seg_reserve(&lazy, (size_t)p * LIMIT_PAGE, LIMIT_PAGE);
            ln->reserved += rc == 0;
            full_r = rc != 0;
            ln->unexpected += rc && rc != -ENOSPC;
        }
        if (!full_c) {
            snprintf(what, sizeof(what), "t%d.%d", ln->id, p);
            seg_path(path, sizeof(path), ln->dir, getpid(), what);
            int rc = seg_create_in(&whole, ln->budget, path, 2 * LIMIT_PAGE, -1, 0);
            if (rc == 0)
                seg_free(&whole); /* its bytes stay counted: freeing gives none back */
            ln->created += rc == 0;
            full_c = rc != 0;
            ln->unexpected += rc && rc != -ENOSPC;
        }
    }
    seg_free(&lazy);
    return NULL;
}

static void test_limit_threads(void **state)
{
    struct fixture *f = *state;
    const char *d = rundir(f);
    uint64_t limit = (uint64_t)LIMIT_PAGES * LIMIT_PAGE;
    static struct seg_budget budget;
    budget = (struct seg_budget){.limit = limit};
    static struct limit_lane lanes[LIMIT_THREADS];
    for (int i = 0; i < LIMIT_THREADS; i++) {
        lanes[i] = (struct limit_lane){.budget = &budget, .dir = d, .id = i};
        assert_int_equal(pthread_create(&lanes[i].thread, NULL, limit_lane_run, &lanes[i]), 0);
    }
    long pages = 0;
    for (int i = 0; i < LIMIT_THREADS; i++) {
        assert_int_equal(pthread_join(lanes[i].thread, NULL), 0);
        assert_int_equal(lanes[i].unexpected, 0);
        pages += lanes[i].reserved + 2L * lanes[i].created;
    }
    /* the last page may be one a two-page creation could not take */
    assert_true(pages == LIMIT_PAGES || pages == LIMIT_PAGES - 1);
    assert_int_equal(budget.used, (uint64_t)pages * LIMIT_PAGE);
    assert_true(budget.used <= limit);
    assert_int_equal(tu_count_files(d), 0); /* every one created was freed */
    /* past the limit, a segment is refused whole and leaves no file */
    budget.limit = budget.used + LIMIT_PAGE;
    struct seg s;
    char path[PATH_MAX];
    seg_path(path, sizeof(path), d, getpid(), "over");
    assert_int_equal(seg_create_in(&s, &budget, path, 2 * LIMIT_PAGE, -1, 0), -ENOSPC);
    assert_int_equal(tu_count_files(d), 0);
    assert_int_equal(seg_create_in(&s, &budget, path, LIMIT_PAGE, -1, 0), 0);
    seg_free(&s);
    /* a budget is its segments' alone: one charged to nothing is not refused */
    assert_int_equal(seg_create(&s, path, 2 * LIMIT_PAGE), 0);
    seg_free(&s);
}

/* Our names, exactly: what the engine makes is recognised, anything near it is not. */
static void test_names(void **state)
{
    char w[128], run[160];
    seg_weights_name(w, sizeof(w), 0xfad599fef11aaf08ull, 1, 0, 2, 1, 0);
    assert_string_equal(w, "w-fad599fef11aaf08-l1-r0of2-n1.weights");
    assert_true(seg_is_weights_name(w));
    seg_weights_name(w, sizeof(w), 1, 3, 1, 2, -1, 1);
    assert_string_equal(w, "w-0000000000000001-l3-r1of2e-nx.weights"); /* experts placed whole */
    assert_true(seg_is_weights_name(w));
    static const char *const not_weights[] = {"w-link.weights",
                                              "w-0123.weights",
                                              "w-fad599fef11aaf08-l1-r0of2-n1.weights.bak",
                                              "w-FAD599FEF11AAF08-l1-r0of2-n1.weights",
                                              "w-fad599fef11aaf08-l1-r0of2-n.weights",
                                              "w-fad599fef11aaf080-l1-r0of2-n1.weights",
                                              "x-fad599fef11aaf08-l1-r0of2-n1.weights",
                                              "w-fad599fef11aaf08-l1-r0of2ee-n1.weights",
                                              "w-fad599fef11aaf08-l1-r0of2x-n1.weights",
                                              ""};
    for (size_t i = 0; i < sizeof(not_weights) / sizeof(not_weights[0]); i++)
        assert_false(seg_is_weights_name(not_weights[i]));

    static const char *const runs[] = {SEG_RUN_SOCK, SEG_RUN_EXCHANGE, "kv.r0", "kv.r15"};
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        snprintf(run, sizeof(run), "123.%s", runs[i]);
        assert_int_equal(seg_run_pid(run), 123);
    }
    snprintf(run, sizeof(run), "77.%s", w); /* a weights segment being built */
    assert_int_equal(seg_run_pid(run), 77);
    static const char *const not_runs[] = {"123.sock.bak", "123.kv.r", "123.kv.r0~", "123.kv",
                                           "123.exchange.old", "123.notes", "123x.sock", "0.sock",
                                           "-5.sock", "99999999999.sock", "123.", "123",
                                           "123.w-link.weights", ".sock"};
    for (size_t i = 0; i < sizeof(not_runs) / sizeof(not_runs[0]); i++)
        assert_int_equal(seg_run_pid(not_runs[i]), 0);
}

static void test_clean_stale(void **state)
{
    struct fixture *f = *state;
    const char *d = rundir(f);
    pid_t dead = tu_dead_pid(), me = getpid();
    char name[64];
    snprintf(name, sizeof(name), "%d.exchange", (int)dead);
    touch(d, name);
    snprintf(name, sizeof(name), "%d.kv.r0", (int)dead);
    touch(d, name);
    snprintf(name, sizeof(name), "%d.exchange", (int)me);
    touch(d, name);
    snprintf(name, sizeof(name), "%d.sock", (int)getppid()); /* alive too */
    touch(d, name);
    /* names that do not follow "<pid>.<what>" are never touched */
    static const char *const others[] = {"notes.txt", "123abc.x", "0.x", "-5.x", "99999999999.x",
                                         "42", "7x.weights", "123.sock.bak", "123.weights"};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
        touch(d, others[i]);
    const int n_others = (int)(sizeof(others) / sizeof(others[0]));

    assert_int_equal(seg_clean_stale(d), 2);
    snprintf(name, sizeof(name), "%d.exchange", (int)dead);
    assert_false(exists(d, name));
    snprintf(name, sizeof(name), "%d.exchange", (int)me);
    assert_true(exists(d, name));
    for (int i = 0; i < n_others; i++)
        assert_true(exists(d, others[i]));
    assert_int_equal(tu_count_files(d), 2 + n_others);
    assert_int_equal(seg_clean_stale(d), 0); /* nothing more to do */

    /* seg_clean_pid removes one coordinator's files, alive or not */
    snprintf(name, sizeof(name), "%d.kv.r1", (int)me);
    touch(d, name);
    assert_int_equal(seg_clean_pid(d, me), 2);
    assert_int_equal(tu_count_files(d), 1 + n_others);
    assert_int_equal(seg_clean_pid(d, me), 0);
    /* a missing directory is nothing to clean */
    char none[PATH_MAX];
    tu_path(none, sizeof(none), "%s/none", f->base);
    assert_int_equal(seg_clean_stale(none), 0);
}

/* A fresh zeroed segment of @size bytes at "<pid>.@what", created through seg_create. */
static void make_seg(struct seg *s, const char *d, const char *what, size_t size)
{
    char path[PATH_MAX];
    seg_path(path, sizeof(path), d, getpid(), what);
    assert_int_equal(seg_create(s, path, size), 0);
}

static void test_exchange_layout(void **state)
{
    struct fixture *f = *state;
    const char *d = rundir(f);
    const uint32_t max_tokens = 100, vocab = 512, rows = 4, ranks = 2, dim = 64, max_blocks = 20;
    const struct seg_exchange_dims dims = {max_tokens, vocab, rows, ranks, dim, max_blocks};
    size_t size = seg_exchange_bytes(&dims);
    /* the header in 128 bytes, 400 token bytes padded to 448, 80 block-table bytes to 128,
     * logits, the all-reduce area */
    assert_int_equal(size,
                     128 + 448 + 128 + rows * vocab * 4 + seg_ar_bytes(ranks, SEG_MAX_CHUNK * dim));
    struct seg w, r;
    make_seg(&w, d, "exchange", size);
    /* a zeroed segment has no magic yet */
    assert_int_equal(seg_exchange_check(w.base, size, vocab, ranks, dim), -EINVAL);
    seg_exchange_init(w.base, &dims);
    assert_int_equal(seg_exchange_check(w.base, size, vocab, ranks, dim), 0);

    /* a worker maps it read-only and sees the same layout */
    assert_int_equal(seg_map(&r, w.path, size, false), 0);
    assert_int_equal(seg_exchange_check(r.base, size, vocab, ranks, dim), 0);
    assert_int_equal(seg_exchange_check(r.base, size, vocab + 1, ranks, dim), -EINVAL);
    assert_int_equal(seg_exchange_check(r.base, size - 4, vocab, ranks, dim), -EINVAL);
    assert_int_equal(seg_exchange_check(r.base, size + 64, vocab, ranks, dim), -EINVAL);
    assert_int_equal(seg_exchange_check(r.base, 71, vocab, ranks, dim), -EINVAL);

    /* tokens, block tables, logits: inside the segment and apart */
    uint8_t *base = w.base;
    int32_t *tok = seg_exchange_tokens(w.base);
    uint32_t *blk = seg_exchange_blocks(w.base);
    float *lg = seg_exchange_logits(w.base);
    assert_ptr_equal(tok, base + 128);
    assert_true((uint8_t *)(tok + max_tokens) <= (uint8_t *)blk);
    assert_true((uint8_t *)(blk + max_blocks) <= (uint8_t *)lg);
    assert_true((uint8_t *)(lg + (size_t)rows * vocab) <= (uint8_t *)seg_exchange_ar(w.base));
    assert_true((uint8_t *)seg_exchange_ar(w.base) < base + size);
    assert_int_equal(seg_exchange_check(r.base, size, vocab, ranks + 1, dim), -EINVAL);
    assert_int_equal(seg_exchange_check(r.base, size, vocab, ranks, dim + 1), -EINVAL);
    assert_int_equal(((uintptr_t)lg) % 64, 0);
    tok[max_tokens - 1] = 7;
    lg[(size_t)rows * vocab - 1] = 1.5f;
    assert_int_equal(seg_exchange_tokens(r.base)[max_tokens - 1], 7);
    assert_true(seg_exchange_logits(r.base)[(size_t)rows * vocab - 1] == 1.5f);

    /* a corrupt header field */
    struct seg_exchange *h = w.base;
    h->logits_off += 64;
    assert_int_equal(seg_exchange_check(r.base, size, vocab, ranks, dim), -EINVAL);
    h->logits_off -= 64;
    h->max_tokens += 16; /* past the 64-byte padding of tokens[]: the sizes no longer agree */
    assert_int_equal(seg_exchange_check(r.base, size, vocab, ranks, dim), -EINVAL);
    h->max_tokens -= 16;
    assert_int_equal(seg_exchange_check(r.base, size, vocab, ranks, dim), 0);
    h->max_blocks += 16; /* the same for the block tables */
    assert_int_equal(seg_exchange_check(r.base, size, vocab, ranks, dim), -EINVAL);
    seg_free(&r);
    seg_free(&w);
}

static void test_kv_layout(void **state)
{
    struct fixture *f = *state;
    const char *d = rundir(f);
    const uint32_t n_blocks = 3, n_layers = 2, kv_dim = 8;
    size_t size = seg_kv_bytes(n_blocks, n_layers, kv_dim, false);
    size_t plane = (size_t)SEG_KV_BLOCK * kv_dim; /* floats of one block's keys of one layer */
    assert_int_equal(size, 64 + n_blocks * n_layers * 2 * plane * sizeof(float));
    assert_int_equal(seg_kv_block_bytes(n_layers, kv_dim, false),
                     n_layers * 2 * plane * sizeof(float));
    struct seg w, r;
    make_seg(&w, d, "kv0", size);
    assert_int_equal(seg_kv_check(w.base, size, n_layers, kv_dim, false), -EINVAL);
    seg_kv_init(w.base, n_blocks, n_layers, kv_dim, false);
    assert_int_equal(seg_map(&r, w.path, size, true), 0);
    assert_int_equal(seg_kv_check(r.base, size, n_layers, kv_dim, false), 0);
    assert_int_equal(seg_kv_check(r.base, size, n_layers + 1, kv_dim, false), -EINVAL);
    assert_int_equal(seg_kv_check(r.base, size, n_layers, kv_dim - 1, false), -EINVAL);
    assert_int_equal(seg_kv_check(r.base, size - 4, n_layers, kv_dim, false), -EINVAL);
    assert_int_equal(seg_kv_check(r.base, size + 4, n_layers, kv_dim, false), -EINVAL);
    assert_int_equal(seg_kv_check(r.base, 32, n_layers, kv_dim, false), -EINVAL);

    /* the planes tile the data region in (block, layer) order: keys, then values, then the next
     * layer's keys; the last values end exactly at the end of the segment */
    float *data = (float *)((uint8_t *)w.base + 64), *expect = data;
    size_t bf = seg_kv_block_floats(w.base);
    assert_int_equal(bf, n_layers * 2 * plane);
    for (uint32_t b = 0; b < n_blocks; b++)
        for (uint32_t l = 0; l < n_layers; l++) {
            float *k = seg_kv_keys(w.base, l) + b * bf, *v = seg_kv_values(w.base, l) + b * bf;
            assert_ptr_equal(k, expect);
            assert_ptr_equal(v, k + plane);
            expect = v + plane;
        }
    float *k = seg_kv_keys(w.base, n_layers - 1) + (n_blocks - 1) * bf;
    float *v = seg_kv_values(w.base, n_layers - 1) + (n_blocks - 1) * bf;
    assert_true(k + plane <= v); /* disjoint */
    assert_true((uint8_t *)k >= (uint8_t *)w.base + 64);
    assert_ptr_equal((uint8_t *)(v + plane), (uint8_t *)w.base + size);
    /* writes through one mapping land where the other looks */
    v[plane - 1] = 3.25f;
    k[0] = -1.0f;
    assert_true((seg_kv_values(r.base, n_layers - 1) + (n_blocks - 1) * bf)[plane - 1] == 3.25f);
    assert_true((seg_kv_keys(r.base, n_layers - 1) + (n_blocks - 1) * bf)[0] == -1.0f);
    /* no blocks at all, or blocks of another size, are refused */
    struct seg_kv *h = w.base;
    h->block_tokens = SEG_KV_BLOCK * 2;
    assert_int_equal(seg_kv_check(r.base, size, n_layers, kv_dim, false), -EINVAL);
    h->block_tokens = SEG_KV_BLOCK;
    h->n_blocks = 0;
    assert_int_equal(seg_kv_check(r.base, size, n_layers, kv_dim, false), -EINVAL);
    seg_free(&r);
    seg_free(&w);
    /* keys only (latent attention): half the bytes, the values are the keys' rows, and a
     * segment of the other kind is refused */
    size_t ko = seg_kv_bytes(n_blocks, n_layers, kv_dim, true);
    assert_int_equal(ko, 64 + n_blocks * n_layers * plane * sizeof(float));
    make_seg(&w, d, "kv1", ko);
    seg_kv_init(w.base, n_blocks, n_layers, kv_dim, true);
    assert_int_equal(seg_kv_check(w.base, ko, n_layers, kv_dim, true), 0);
    assert_int_equal(seg_kv_check(w.base, ko, n_layers, kv_dim, false), -EINVAL);
    assert_int_equal(seg_kv_block_floats(w.base), n_layers * plane);
    for (uint32_t l = 0; l < n_layers; l++) {
        assert_ptr_equal(seg_kv_values(w.base, l), seg_kv_keys(w.base, l));
        assert_ptr_equal(seg_kv_keys(w.base, l), (float *)((uint8_t *)w.base + 64) + l * plane);
    }
    seg_free(&w);
}

/* A full tmpfs fails at seg_create with -ENOSPC (posix_fallocate), not later with SIGBUS on
 * first touch, and leaves no file behind. */
static void test_create_enospc(void **state)
{
    struct fixture *f = *state;
    char mnt[PATH_MAX];
    tu_path(mnt, sizeof(mnt), "%s/small", f->base);
    assert_int_equal(mkdir(mnt, 0700), 0);
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700") < 0) {
        char why[256];
        snprintf(why, sizeof(why), "test_create_enospc: cannot mount a 1 MiB tmpfs (%s); run as "
                 "root with mount permission (CAP_SYS_ADMIN, e.g. outside an unprivileged "
                 "container) to check -ENOSPC", strerror(errno));
        print_message("%s\n", why);
        skip();
    }
    char out[PATH_MAX], path[PATH_MAX];
    int rc = seg_rundir(mnt, out, sizeof(out));
    seg_path(path, sizeof(path), mnt, getpid(), "big");
    struct seg s;
    int created = rc == 0 ? seg_create(&s, path, 4u << 20) : rc;
    int left = tu_count_files(mnt);
    /* a small one still fits */
    struct seg small;
    seg_path(path, sizeof(path), mnt, getpid(), "small");
    int small_rc = rc == 0 ? seg_create(&small, path, 64 * 1024) : rc;
    if (small_rc == 0)
        seg_free(&small);
    if (created == 0)
        seg_free(&s);
    assert_int_equal(umount2(mnt, MNT_DETACH), 0);
    assert_int_equal(rc, 0);
    assert_int_equal(created, -ENOSPC);
    assert_int_equal(left, 0);
    assert_int_equal(small_rc, 0);
}

/* Mounts a tmpfs with @opts at @base/@name; false (after saying why) without mount permission. */
static bool mount_tmpfs(const char *base, const char *name, const char *opts, char *mnt, size_t len)
{
    tu_path(mnt, len, "%s/%s", base, name);
    assert_int_equal(mkdir(mnt, 0700), 0);
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0)
        return true;
    print_message("cannot mount a tmpfs (%s) with %s; run as root with mount permission "
                  "(CAP_SYS_ADMIN, e.g. outside an unprivileged container) to check it\n",
                  strerror(errno), opts);
    return false;
}

/* SEG_HUGE: on a tmpfs in "advise" mode, a segment reserved piece by piece gets 2 MiB pages
 * (fallocate, which has no mapping to advise, would give 4 KiB ones) and seg_huge_bytes says
 * so; one without SEG_HUGE gets none; a full tmpfs is still -ENOSPC from seg_reserve, not
 * SIGBUS. Where the kernel has no transparent huge pages, SEG_HUGE gets 4 KiB pages and says so. */
static void test_huge_pages(void **state)
{
    struct fixture *f = *state;
    char mnt[PATH_MAX], path[PATH_MAX];
    if (!mount_tmpfs(f->base, "huge", "size=16m,huge=advise,mode=0700", mnt, sizeof(mnt)))
        skip();
    bool thp = access("/sys/kernel/mm/transparent_hugepage/shmem_enabled", F_OK) == 0;
    const size_t size = 4u << 20;
    struct seg h, plain;
    seg_path(path, sizeof(path), mnt, getpid(), "huge");
    assert_int_equal(seg_create_on(&h, path, size, -1, SEG_LAZY | SEG_HUGE), 0);
    seg_path(path, sizeof(path), mnt, getpid(), "plain");
    assert_int_equal(seg_create_on(&plain, path, size, -1, SEG_LAZY), 0);
    for (size_t off = 0; off < size; off += 256 << 10) { /* as the load reserves, a tensor at a time */
        assert_int_equal(seg_reserve(&h, off, 256 << 10), 0);
        assert_int_equal(seg_reserve(&plain, off, 256 << 10), 0);
    }
    memset(h.base, 1, size);
    memset(plain.base, 1, size);
    long long hb = seg_huge_bytes(&h), pb = seg_huge_bytes(&plain);
    print_message("SEG_HUGE: %lld of %zu bytes in 2 MiB pages; without it %lld\n", hb, size, pb);
    seg_free(&h);
    seg_free(&plain);
    assert_int_equal(pb, 0);
    if (thp)
        assert_true(hb > 0);
    else
        assert_int_equal(hb, 0);
    assert_int_equal(umount2(mnt, MNT_DETACH), 0);

    if (!mount_tmpfs(f->base, "full", "size=3m,huge=advise,mode=0700", mnt, sizeof(mnt)))
        skip();
    seg_path(path, sizeof(path), mnt, getpid(), "big");
    assert_int_equal(seg_create_on(&h, path, 8u << 20, -1, SEG_LAZY | SEG_HUGE), 0);
    int rc = 0;
    for (size_t off = 0; off < (8u << 20) && !rc; off += 1u << 20)
        rc = seg_reserve(&h, off, 1u << 20);
    seg_free(&h);
    int left = tu_count_files(mnt);
    assert_int_equal(umount2(mnt, MNT_DETACH), 0);
    assert_int_equal(rc, -ENOSPC);
    assert_int_equal(left, 0);
}

/* The NUMA policy of sampled pages of @s: every one MPOL_BIND to exactly @node, and resident on
 * it (move_pages(2) with no target nodes reports where each page is). */
static void expect_bound(struct seg *s, size_t off, size_t len, int node)
{
    long ps = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < 16; i++) {
        char *p = (char *)s->base + off + (len - 1) / 15 * i / (size_t)ps * (size_t)ps;
        int mode = -1;
        unsigned long mask[16] = {0};
        assert_int_equal(syscall(SYS_get_mempolicy, &mode, mask, sizeof(mask) * 8, p, MPOL_F_ADDR),
                         0);
        assert_int_equal(mode, MPOL_BIND);
        for (int n = 0; n < (int)sizeof(mask) * 8; n++)
            assert_int_equal(!!(mask[n / 64] & (1ul << (n % 64))), n == node);
        void *pages[1] = {p};
        int status[1] = {-1000};
        assert_int_equal(syscall(SYS_move_pages, 0, 1ul, pages, NULL, status, 0), 0);
        assert_int_equal(status[0], node);
    }
}

/* Segments bound to a node: the policy is on every page, those allocated at creation and those
 * reserved later (SEG_LAZY), in files and in memfds. On a one-node machine this checks node 0's
 * policy; test_numa checks real placement across nodes in a VM. */
static void test_node_binding(void **state)
{
    struct fixture *f = *state;
    if (numa_available() < 0) {
        print_message("test_node_binding: the kernel has no NUMA support; nothing to check\n");
        skip();
    }
    char path[PATH_MAX];
    seg_path(path, sizeof(path), rundir(f), getpid(), "bound");
    size_t size = 8u << 20;
    struct seg a, b;
    assert_int_equal(seg_create_on(&a, path, size, 0, 0), 0);
    memset(a.base, 1, size);
    expect_bound(&a, 0, size, 0);
    seg_free(&a);
    assert_int_equal(seg_create_on(&b, "bound", size, 0, SEG_ANON | SEG_LAZY), 0);
    assert_int_equal(seg_reserve(&b, 0, size / 2), 0);
    memset(b.base, 1, size / 2);
    expect_bound(&b, 0, size / 2, 0);
    /* another process maps a memfd segment by its /proc path */
    struct seg m;
    assert_non_null(strstr(b.path, "/proc/"));
    assert_int_equal(seg_map(&m, b.path, size, false), 0);
    assert_int_equal(((unsigned char *)m.base)[size / 2 - 1], 1);
    seg_free(&m);
    seg_free(&b);
    assert_int_equal(tu_count_files(rundir(f)), 0);
}

/* seg_publish: the final name appears at once and outlives seg_free; a second publisher of the
 * same name gets -EEXIST. */
static void test_publish(void **state)
{
    struct fixture *f = *state;
    char tmp[PATH_MAX], tmp2[PATH_MAX], fin[PATH_MAX + 16];
    seg_path(tmp, sizeof(tmp), rundir(f), getpid(), "build.w");
    seg_path(tmp2, sizeof(tmp2), rundir(f), getpid(), "build2.w");
    tu_path(fin, sizeof(fin), "%s/w-final.weights", rundir(f));
    struct seg a, b, m;
    assert_int_equal(seg_create(&a, tmp, 4096), 0);
    assert_int_equal(seg_create(&b, tmp2, 4096), 0);
    ((char *)a.base)[0] = 7;
    assert_int_equal(seg_publish(&a, fin), 0);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(seg_publish(&b, fin), -EEXIST);
    seg_free(&b); /* still under its temporary name: removed */
    seg_free(&a); /* published: stays */
    assert_int_equal(access(tmp2, F_OK), -1);
    assert_int_equal(seg_map(&m, fin, 4096, false), 0);
    assert_int_equal(((char *)m.base)[0], 7);
    seg_free(&m);
    assert_int_equal(unlink(fin), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rundir_created_private, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rundir_refuses_shared, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_map_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_bad_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limit_threads, setup, teardown),
        cmocka_unit_test(test_names),
        cmocka_unit_test_setup_teardown(test_clean_stale, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exchange_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kv_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_binding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_publish, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
