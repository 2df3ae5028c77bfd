/* SPDX-License-Identifier: MIT */
/* End-to-end tensor parallelism: R = 1..4 worker processes on stories260K. Greedy text identical
 * to the golden files, f32 logits within 1e-6 KLD of the reference at every R, w4a16 at R = 2
 * within 1e-4 of R = 1 (group 64, and 96, which divides no row or shard here), w4a8 within 5% of
 * R = 1's divergence, layout errors, and a worker dying in a step: reported at once, nothing
 * left behind.
 *
 * This machine may have 2 CPUs: R = 3 and 4 share them through --cpus (one CPU per rank,
 * repeated), which the automatic layout refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sched.h>
#include <sys/time.h>

#include "testutil.h"

static char dir[4096], rundir[4096], env_rundir[4200];

/* --cpus maps for R ranks on however many CPUs this process may use */
static char cpus_map[4][64];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "tp");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(env_rundir, sizeof(env_rundir), "SHARDLM_RUNTIME_DIR=%s", rundir);
    const char *g64[] = {"--group", "64", NULL}, *g128[] = {"--group", "128", NULL};
    const char *g96[] = {"--group", "96", NULL};
    char out[4300];
    tu_path(out, sizeof(out), "%s/f32.shlm", dir);
    if (tu_convert(out, "f32", NULL))
        return -1;
    tu_path(out, sizeof(out), "%s/w4a16.shlm", dir);
    if (tu_convert(out, "w4a16", g64))
        return -1;
    tu_path(out, sizeof(out), "%s/w4a8.shlm", dir);
    if (tu_convert(out, "w4a8", g128))
        return -1;
    tu_path(out, sizeof(out), "%s/w4a16g96.shlm", dir);
    if (tu_convert(out, "w4a16", g96))
        return -1;
    /* an int4 tied embedding: each rank's LM head is a view of its tiled rows */
    static const char *const h4[] = {"--group", "128", "--head-bits", "4", NULL};
    tu_path(out, sizeof(out), "%s/w4a8h4.shlm", dir);
    if (tu_convert(out, "w4a8", h4))
        return -1;
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    int cpus[CPU_SETSIZE], n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    for (int R = 1; R <= 4; R++) {
        char *p = cpus_map[R - 1];
        p[0] = 0;
        for (int r = 0; r < R; r++)
            sprintf(p + strlen(p), "%s%d", r ? ":" : "", cpus[r % n]);
    }
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

static void assert_clean(void)
{
    assert_true(tu_count_run_files(rundir) <= 0);
    assert_false(tu_workers_alive(rundir));
}

static void run(struct tu_run *r, char *const args[], char *const extra_env[],
                void (*on_start)(pid_t, void *), void *arg)
{
    tu_run_shardlm(r, env_rundir, args, extra_env, 120, on_start, arg);
}

static void test_golden_every_rank_count(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4300], path[4300];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    for (int no = 1; no <= 4; no++) {
        char prompt[256], n[16];
        int n_ids;
        assert_int_equal(tu_golden_prompt(tu_data(), no, prompt, sizeof(prompt), &n_ids), 0);
        snprintf(n, sizeof(n), "%d", 257 - n_ids);
        tu_path(path, sizeof(path), "%s/golden/stories260K/p%d.txt", tu_data(), no);
        size_t glen;
        char *golden = tu_slurp(path, &glen);
        for (int R = 1; R <= 4; R++) {
            char *args[] = {"generate", "-m", model, "-p", prompt, "-n", n, "--temp", "0",
                            "--cpus", cpus_map[R - 1], NULL};
            run(r, args, NULL, NULL, NULL);
            if (r->status || r->out_len != glen || memcmp(r->out, golden, glen))
                fprintf(stderr, "prompt %d R=%d status %d\n%s\n%s\n", no, R, r->status, r->out,
                        r->err);
            assert_int_equal(r->status, 0);
            assert_int_equal(r->out_len, glen);
            assert_memory_equal(r->out, golden, glen);
            assert_clean();
        }
        free(golden);
    }
    free(r);
}

/* eval's overall line; @save (or NULL) keeps this run's logits as a reference */
static double eval_kld(const char *model, const char *ref, int R, const char *save)
{
    struct tu_run *r = malloc(sizeof(*r));
    char m[4300];
    tu_path(m, sizeof(m), "%s/%s.shlm", dir, model);
    char *args[] = {"eval", "-m", m, "--ref", (char *)ref, "--cpus", cpus_map[R - 1],
                    save ? "--save" : NULL, (char *)save, NULL};
    run(r, args, NULL, NULL, NULL);
    if (r->status)
        fprintf(stderr, "%s", r->err);
    assert_int_equal(r->status, 0);
    double kld, top1, ppl;
    char *last = strstr(r->out, "overall ");
    assert_non_null(last);
    assert_int_equal(sscanf(last, "overall kld=%lf top1=%lf ppl=%lf", &kld, &top1, &ppl), 3);
    fprintf(stderr, "eval %-6s R=%d against %s: kld=%.6g top1=%.4f\n", model, R,
            strstr(ref, "golden") ? "golden" : "R=1", kld, top1);
    free(r);
    assert_clean();
    return kld;
}

static void test_fidelity_across_ranks(void **state)
{
    char golden[4300], ref1[4300], ref8[4300], ref96[4300];
    tu_path(golden, sizeof(golden), "%s/golden/stories260K", tu_data());
    tu_path(ref1, sizeof(ref1), "%s/w4a16-r1", dir);
    tu_path(ref8, sizeof(ref8), "%s/w4a8-r1", dir);
    tu_path(ref96, sizeof(ref96), "%s/w4a16g96-r1", dir);
    for (int R = 1; R <= 4; R++)
        assert_true(eval_kld("f32", golden, R, NULL) < 1e-6);
    /* w4a16: the same int4 sums split over ranks, in another order */
    double k64 = eval_kld("w4a16", golden, 1, ref1);
    for (int R = 2; R <= 4; R++)
        assert_true(eval_kld("w4a16", ref1, R, NULL) < 1e-4);
    /* group 96: rows of 64 and 172, O and down shards starting inside a group; as close to the
     * reference as group 64 (measured 0.0758 and 0.0728) */
    assert_true(eval_kld("w4a16g96", golden, 1, ref96) <= k64 * 1.1);
    for (int R = 2; R <= 4; R++)
        assert_true(eval_kld("w4a16g96", ref96, R, NULL) < 1e-4);
    /* w4a8: each rank quantizes its slice of the O and down inputs with its own int8 scale */
    double k1 = eval_kld("w4a8", golden, 1, ref8);
    for (int R = 2; R <= 4; R++)
        assert_true(eval_kld("w4a8", golden, R, NULL) <= k1 * 1.05);
    double h1 = eval_kld("w4a8h4", golden, 1, NULL);
    for (int R = 2; R <= 4; R++)
        assert_true(eval_kld("w4a8h4", golden, R, NULL) <= h1 * 1.05);
}

static void test_layout_errors(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4300];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    char *a1[] = {"generate", "-m", model, "-p", "Once", "-n", "2", "--cpus",
                  "0:0:0:0:0:0:0:0:0", NULL};
    run(r, a1, NULL, NULL, NULL);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "more than the model's 8 attention heads"));
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    char n[16];
    snprintf(n, sizeof(n), "%d", CPU_COUNT(&set) + 1);
    char *a2[] = {"generate", "-m", model, "-p", "Once", "-n", "2", "--workers", n, NULL};
    run(r, a2, NULL, NULL, NULL);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "more workers than the"));
    char *a3[] = {"generate", "-m", model, "-p", "Once", "--cpus", "0-", NULL};
    run(r, a3, NULL, NULL, NULL);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "is not a CPU list"));
    char *a4[] = {"generate", "-m", model, "-p", "Once", "--cpus", "0", "--workers", "2", NULL};
    run(r, a4, NULL, NULL, NULL);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "--workers 2 but --cpus lists 1"));
    assert_clean();
    free(r);
}

/* --verbose: one `rank <r> node <n> cpus <list> pid <pid>` line per rank, read back from the
 * workers, then per-step lines with the all-reduce time and every rank's compute time. */
static void test_verbose_layout_lines(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4300];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    char *args[] = {"generate", "-m", model, "-p", "Once", "-n", "3", "--cpus", cpus_map[1],
                    "--verbose", NULL};
    run(r, args, NULL, NULL, NULL);
    assert_int_equal(r->status, 0);
    for (int rank = 0; rank < 2; rank++) {
        char want[32], cpu[16];
        snprintf(want, sizeof(want), "rank %d node ", rank);
        char *l = strstr(r->err, want);
        assert_non_null(l);
        int rr, node, pid;
        assert_int_equal(sscanf(l, "rank %d node %d cpus %15s pid %d", &rr, &node, cpu, &pid), 4);
        /* each rank's CPU as --cpus gave it ("a:b") */
        const char *colon = strchr(cpus_map[1], ':');
        char first[16];
        snprintf(first, sizeof(first), "%.*s", (int)(colon - cpus_map[1]), cpus_map[1]);
        assert_string_equal(cpu, rank ? colon + 1 : first);
        assert_true(pid > 0);
    }
    assert_non_null(strstr(r->err, "allreduce"));
    assert_non_null(strstr(r->err, " r1 "));
    free(r);
}

/* Whether all @n workers of our runtime directory have mapped their weights (attached). */
static bool workers_attached(int n)
{
    char cmd[4600];
    tu_path(cmd, sizeof(cmd),
            "n=0; for p in $(pgrep -f '[s]hardlm-worker --endpoint ipc://%s/'); do "
            "grep -q '\\.weights' /proc/$p/maps 2>/dev/null && n=$((n+1)); done; [ $n -eq %d ]",
            rundir, n);
    return system(cmd) == 0;
}

struct kill_random {
    int rank, n_ranks, delay_ms, rc;
    struct timeval when; /* of the kill */
};

/* Kills rank k->rank k->delay_ms after every worker attached (a kill during the start would
 * fail the start, which is not what these tests are about; not after a fixed time from the
 * start either, which a loaded host makes longer). */
static void kill_rank_later(pid_t pid, void *arg)
{
    struct kill_random *k = arg;
    char cmd[4400];
    for (int i = 0; i < 1000 && !workers_attached(k->n_ranks); i++)
        usleep(10 * 1000);
    usleep((useconds_t)k->delay_ms * 1000);
    tu_path(cmd, sizeof(cmd), "pkill -9 -f '[s]hardlm-worker --endpoint ipc://%s/[^ ]* --rank %d '",
            rundir, k->rank);
    k->rc = system(cmd);
    gettimeofday(&k->when, NULL);
}

/* A worker killed in the middle of generation with --restarts 0: the coordinator reports it
 * (the other rank is blocked in an all-reduce with it: the barrier notices) and cleans up within
 * a second or so. */
static void test_worker_dies_in_a_step(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4300];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    char *args[] = {"generate", "-m", model,    "-p",        "Once upon a time", "-n", "400",
                    "--temp",   "0",  "--cpus", cpus_map[1], "--restarts",       "0",  NULL};
    char *env[] = {"SHARDLM_FAULT=step_delay_ms=20", NULL};
    struct kill_random k = {.rank = 1, .n_ranks = 2, .delay_ms = 300, .rc = -1};
    run(r, args, env, kill_rank_later, &k);
    struct timeval end;
    gettimeofday(&end, NULL);
    double after = (double)(end.tv_sec - k.when.tv_sec) + (end.tv_usec - k.when.tv_usec) / 1e6;
    fprintf(stderr, "coordinator exited %.3f s after the kill: %s", after, r->err);
    assert_int_equal(k.rc, 0);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "worker rank 1"));
    assert_non_null(strstr(r->err, "killed by signal 9"));
    /* 0.2 s on a 2-CPU VM; 3 s leaves a loaded host room and is still far below the 30 s all-reduce
     * timeout that a barrier that did not notice the death would wait out */
    assert_true(after < 3.0);
    assert_clean();
    free(r);
}


static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fault injection: a random worker of 2 or 3 killed (SIGKILL) at a random moment (20-420 ms after
 * the workers attached) of a greedy generation of 4 sequences, three at once and the fourth on
 * the first's cached prefix blocks, 24 times. Each time the coordinator restarts it on its CPUs
 * over the same segments, runs the step again, and every text is the uninterrupted run's, byte for
 * byte (and that run's texts are each prompt's alone); the recovery times are reported. Seeded: the
 * seed is printed, SHARDLM_TEST_SEED repeats a run. */
static void test_worker_restarts(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4300];
    static char want[2][sizeof(r->out)];
    tu_path(model, sizeof(model), "%s/w4a8.shlm", dir);
    const char *seed_env = getenv("SHARDLM_TEST_SEED");
    unsigned seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    fprintf(stderr, "fault injection: seed %u (SHARDLM_TEST_SEED=%u repeats it)\n", seed, seed);
    srand(seed);
    /* three run at once (--max-seqs 3); the fourth starts when one ends, on the blocks of the
     * first's long prefix that the prefix cache kept */
    static const char *prompts[4] = {
        "Once upon a time, there was a little dog named Max. Max loved to run in the big green "
        "park with his best friend Tom. Max",
        "Lily and Tom", "The cat sat",
        "Once upon a time, there was a little dog named Max. Max loved to run in the big green "
        "park with his best friend Tom. One day"};
#define FOUR_PROMPTS                                                                               \
    "-p", (char *)prompts[0], "-p", (char *)prompts[1], "-p", (char *)prompts[2], "-p",            \
        (char *)prompts[3]
    for (int R = 2; R <= 3; R++) {
        char *args[] = {"generate", "-m",     model,           "-n",         "200", "--temp",
                        "0",        "--cpus", cpus_map[R - 1], FOUR_PROMPTS, NULL};
        run(r, args, NULL, NULL, NULL);
        assert_int_equal(r->status, 0);
        memcpy(want[R - 2], r->out, sizeof(want[0]));
    }
    /* each of the batch's texts is its prompt's alone */
    for (int i = 0; i < 4; i++) {
        char *args[] = {"generate", "-m",     model, "-p",     (char *)prompts[i], "-n",
                        "200",      "--temp", "0",   "--cpus", cpus_map[1],        NULL};
        run(r, args, NULL, NULL, NULL);
        assert_int_equal(r->status, 0);
        char line[sizeof(r->out) + 8];
        snprintf(line, sizeof(line), "[%d] %s", i + 1, r->out);
        if (!strstr(want[0], line))
            fail_msg("prompt %d alone:\n%s\nin the batch:\n%s", i + 1, r->out, want[0]);
    }
    enum { RUNS = 24 };
    double ms[RUNS];
    int restarts = 0;
    for (int i = 0; i < RUNS; i++) {
        int R = 2 + i % 2;
        char *args[] = {"generate", "-m",     model,           "-n",         "200", "--temp",
                        "0",        "--cpus", cpus_map[R - 1], FOUR_PROMPTS, NULL};
        /* 3 ms a step: about 0.7 s of steps after a start of about 0.05 s */
        char *env[] = {"SHARDLM_FAULT=step_delay_ms=3", NULL};
        struct kill_random k = {
            .rank = rand() % R, .n_ranks = R, .delay_ms = 20 + rand() % 400, .rc = -1};
        run(r, args, env, kill_rank_later, &k);
        const char *line = strstr(r->err, "restarted in ");
        if (r->status != 0 || strcmp(r->out, want[R - 2]) != 0 || !line)
            fail_msg("run %d (R %d, rank %d killed after %d ms): status %d, pkill %d, text %s\n%s",
                     i, R, k.rank, k.delay_ms, r->status, k.rc,
                     strcmp(r->out, want[R - 2]) ? "differs" : "the same", r->err);
        assert_int_equal(k.rc, 0);
        assert_true(sscanf(line, "restarted in %lf ms", &ms[restarts]) == 1);
        restarts++;
    }
    qsort(ms, (size_t)restarts, sizeof(double), cmp_double);
    fprintf(stderr,
            "fault injection: %d runs of 4 sequences, %d workers killed and restarted, texts "
            "identical every time; recovery %.1f ms median (%.1f .. %.1f)\n",
            RUNS, restarts, ms[restarts / 2], ms[0], ms[restarts - 1]);
    assert_clean();
    free(r);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_every_rank_count),
        cmocka_unit_test(test_fidelity_across_ranks),
        cmocka_unit_test(test_layout_errors),
        cmocka_unit_test(test_verbose_layout_lines),
        cmocka_unit_test(test_worker_dies_in_a_step),
        cmocka_unit_test(test_worker_restarts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
