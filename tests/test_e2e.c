/* SPDX-License-Identifier: MIT */
/* End-to-end: the shardlm binary with its worker on the bundled stories260K model.
 * Golden greedy text at f32 for the four reference prompts, fidelity bounds per scheme, and the
 * bad-input and failed-start paths (clear one-line error, non-zero exit, nothing left behind). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <sched.h>
#include <time.h>

#include "proto.h"
#include "testutil.h"

#include <sys/stat.h>
#include <zmq.h>

static char dir[4096];    /* models converted once for all tests */
static char rundir[4096]; /* SHARDLM_RUNTIME_DIR of every run: must be empty after each */
static char env_rundir[4200];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "e2e");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(env_rundir, sizeof(env_rundir), "SHARDLM_RUNTIME_DIR=%s", rundir);
    static const char *schemes[][3] = {{"f32", NULL, NULL},
                                       {"bf16", NULL, NULL},
                                       {"w4a16", "--group", "64"},
                                       {"w4a16", "--group", "128"},
                                       {"w4a8", "--group", "128"}};
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        char out[4300];
        tu_path(out, sizeof(out), "%s/%s%s%s.shlm", dir, schemes[i][0],
                schemes[i][2] ? "g" : "", schemes[i][2] ? schemes[i][2] : "");
        const char *extra[] = {schemes[i][1], schemes[i][2], NULL};
        if (tu_convert(out, schemes[i][0], extra))
            return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

/* No segment, socket or other runtime file may outlive a run. */
static void assert_runtime_clean(void)
{
    int n = tu_count_run_files(rundir);
    if (n > 0) {
        char cmd[4200];
        tu_path(cmd, sizeof(cmd), "ls -la '%s' >&2", rundir);
        (void)!system(cmd);
    }
    assert_true(n <= 0);
}

/* No shardlm-worker of ours may outlive a run: they connect to an endpoint in our rundir. */
static void assert_no_workers(void)
{
    assert_false(tu_workers_alive(rundir));
}

/* Waits (up to 10 s) until a worker of ours (its environment names our rundir; its endpoint may
 * be TCP) has mapped the weights: the generation runs, however long the start took on this host.
 * For the signals and kills below, which used to come a fixed time after the start. */
static void wait_worker_attached(void)
{
    char cmd[4600];
    tu_path(cmd, sizeof(cmd),
            "for p in $(pgrep -f '[s]hardlm-worker '); do "
            "tr '\\0' '\\n' </proc/$p/environ 2>/dev/null | grep -qxF 'SHARDLM_RUNTIME_DIR=%s' "
            "&& grep -q '\\.weights' /proc/$p/maps 2>/dev/null && exit 0; done; exit 1",
            rundir);
    for (int i = 0; i < 1000 && system(cmd) != 0; i++)
        usleep(10 * 1000);
}

static void run_shardlm(struct tu_run *r, char *const args[], char *const extra_env[])
{
    tu_run_shardlm(r, env_rundir, args, extra_env, 120, NULL, NULL);
}

static void test_golden_greedy_f32(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    for (int no = 1; no <= 4; no++) {
        char prompt[512], n[16], path[4200];
        int n_ids;
        assert_int_equal(tu_golden_prompt(tu_data(), no, prompt, sizeof(prompt), &n_ids), 0);
        /* the reference fed 256 positions and printed every token after BOS: its text holds
         * 257 - n_ids new tokens unless it stopped at id 1 earlier */
        snprintf(n, sizeof(n), "%d", 257 - n_ids);
        char *args[] = {"generate", "-m", model, "-p", prompt, "-n", n, "--temp", "0", NULL};
        run_shardlm(r, args, NULL);
        tu_path(path, sizeof(path), "%s/golden/stories260K/p%d.txt", tu_data(), no);
        size_t glen;
        char *golden = tu_slurp(path, &glen);
        assert_non_null(golden);
        if (r->status != 0 || r->out_len != glen || memcmp(r->out, golden, glen) != 0)
            fprintf(stderr, "prompt %d: status %d\n--- got\n%s\n--- want\n%s\n--- stderr\n%s\n", no,
                    r->status, r->out, golden, r->err);
        assert_int_equal(r->status, 0);
        assert_int_equal(r->out_len, glen);
        assert_memory_equal(r->out, golden, glen);
        free(golden);
        assert_runtime_clean();
    }
    free(r);
}

/* Runs eval and returns the overall kld / top1 from its last line. */
static void eval_model(const char *name, double *kld, double *top1, double *ppl)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200], ref[4200];
    tu_path(model, sizeof(model), "%s/%s.shlm", dir, name);
    tu_path(ref, sizeof(ref), "%s/golden/stories260K", tu_data());
    char *args[] = {"eval", "-m", model, "--ref", ref, NULL};
    run_shardlm(r, args, NULL);
    if (r->status)
        fprintf(stderr, "eval %s: %s", name, r->err);
    assert_int_equal(r->status, 0);
    char *last = strstr(r->out, "overall ");
    assert_non_null(last);
    assert_int_equal(sscanf(last, "overall kld=%lf top1=%lf ppl=%lf", kld, top1, ppl), 3);
    /* four prompts reported before the overall line */
    int lines = 0;
    for (char *p = r->out; (p = strstr(p, "prompt ")); p++)
        lines++;
    assert_int_equal(lines, 4);
    fprintf(stderr, "eval %-10s kld=%.6g top1=%.4f ppl=%.4f\n", name, *kld, *top1, *ppl);
    free(r);
    assert_runtime_clean();
}

/* Bounds: the issues' targets, and our measured figures with margin (README, table). The int4
 * rows (round to nearest) may be no worse than before issue 17's exact scale search. */
static void test_eval_fidelity(void **state)
{
    double kld, top1, ppl, ppl_f32;
    eval_model("f32", &kld, &top1, &ppl_f32);
    assert_true(kld < 1e-6);
    assert_true(top1 == 1.0);
    assert_true(ppl_f32 > 1.0 && ppl_f32 < 2.0); /* measured 1.8272 */
    eval_model("bf16", &kld, &top1, &ppl);
    assert_true(kld < 2e-4); /* measured 4.3e-05 */
    assert_true(top1 > 0.98);
    eval_model("w4a16g64", &kld, &top1, &ppl);
    assert_true(kld <= 0.0728); /* before issue 17: 0.0728; measured 0.0706 */
    assert_true(top1 > 0.80);
    eval_model("w4a16g128", &kld, &top1, &ppl);
    assert_true(kld <= 0.0755); /* before: 0.0755; measured 0.0719 */
    eval_model("w4a8g128", &kld, &top1, &ppl);
    assert_true(kld <= 0.0844); /* before: 0.0844; measured 0.0716 */
    assert_true(top1 > 0.80);
    assert_true(ppl > ppl_f32 && ppl < ppl_f32 * 1.2);
}

/* Expects exit status 1 or 2, a one-line error containing @needle, no output, nothing left. */
static void expect_failure(struct tu_run *r, const char *needle)
{
    if (r->status == 0 || !strstr(r->err, needle))
        fprintf(stderr, "status %d, stderr: %s (wanted '%s')\n", r->status, r->err, needle);
    assert_true(r->status == 1 || r->status == 2);
    assert_non_null(strstr(r->err, needle));
    assert_non_null(strstr(r->err, "shardlm"));
    assert_runtime_clean();
    assert_no_workers();
}

static void test_bad_checkpoints(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char src[4200], tok[4200], bad[4200], out[4200];
    tu_path(src, sizeof(src), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    tu_path(bad, sizeof(bad), "%s/bad.bin", dir);
    tu_path(out, sizeof(out), "%s/bad.shlm", dir);
    char *args[] = {"convert", bad, "--tokenizer", tok, "--scheme", "w4a8", "-o", out, NULL};

    /* missing */
    unlink(bad);
    run_shardlm(r, args, NULL);
    expect_failure(r, "No such file");
    size_t len = 0;
    char *ck = tu_slurp(src, &len);
    assert_non_null(ck);
    /* truncated inside the header, then inside the weights */
    assert_int_equal(tu_write(bad, ck, 20), 0);
    run_shardlm(r, args, NULL);
    expect_failure(r, "truncated");
    assert_int_equal(tu_write(bad, ck, len - 100), 0);
    run_shardlm(r, args, NULL);
    expect_failure(r, "the header implies");
    /* header sizes that do not match the file: dim 64 -> 96 */
    int32_t dim = 96;
    memcpy(ck, &dim, 4);
    assert_int_equal(tu_write(bad, ck, len), 0);
    run_shardlm(r, args, NULL);
    expect_failure(r, "the header implies");
    /* absurd header fields */
    int32_t huge = 0x7fffffff;
    memcpy(ck + 4, &huge, 4);
    assert_int_equal(tu_write(bad, ck, len), 0);
    run_shardlm(r, args, NULL);
    expect_failure(r, "hidden_dim");
    assert_int_equal(access(out, F_OK), -1); /* no partial output */
    free(ck);

    /* unknown scheme, bad group, a tokenizer of another vocabulary */
    char *a2[] = {"convert", src, "--tokenizer", tok, "--scheme", "q3", "-o", out, NULL};
    run_shardlm(r, a2, NULL);
    expect_failure(r, "unknown scheme 'q3'");
    char *a3[] = {"convert", src, "--tokenizer", tok, "--scheme", "w4a8", "--group", "100", "-o",
                  out, NULL};
    run_shardlm(r, a3, NULL);
    expect_failure(r, "--group");
    char tok32k[4200];
    tu_path(tok32k, sizeof(tok32k), "%s/tokenizers/llama2-tokenizer.bin", tu_data());
    char *a4[] = {"convert", src, "--tokenizer", tok32k, "--scheme", "f32", "-o", out, NULL};
    run_shardlm(r, a4, NULL);
    expect_failure(r, "wrong vocabulary size?");
    assert_int_equal(access(out, F_OK), -1);
    free(r);
}

static void test_bad_model_files(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char good[4200], bad[4200];
    tu_path(good, sizeof(good), "%s/f32.shlm", dir);
    tu_path(bad, sizeof(bad), "%s/bad.shlm", dir);
    /* --no-persist: a complete weights segment of the good file would start warm, without
     * reading the bad one */
    char *args[] = {"generate", "-m",     bad, "-p",           "Once", "-n",
                    "4",        "--temp", "0", "--no-persist", NULL};
    size_t len = 0;
    char *m = tu_slurp(good, &len);
    assert_non_null(m);

    /* wrong magic: the checkpoint itself given as a model */
    char ck[4200];
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    char *a0[] = {"generate", "-m", ck, "-p", "Once", NULL};
    run_shardlm(r, a0, NULL);
    expect_failure(r, "not a .shlm file");
    /* missing */
    unlink(bad);
    run_shardlm(r, args, NULL);
    expect_failure(r, "No such file");
    /* truncated */
    assert_int_equal(tu_write(bad, m, len / 2), 0);
    run_shardlm(r, args, NULL);
    expect_failure(r, "truncated");
    /* a flipped byte in the last tensor's data */
    m[len - 4096 + 7] ^= 0x40;
    assert_int_equal(tu_write(bad, m, len), 0);
    run_shardlm(r, args, NULL);
    expect_failure(r, "checksum mismatch");
    m[len - 4096 + 7] ^= 0x40;
    /* a flipped byte in the header's config */
    m[40] ^= 1;
    assert_int_equal(tu_write(bad, m, len), 0);
    run_shardlm(r, args, NULL);
    expect_failure(r, "header checksum");
    free(m);
    free(r);
}

static void test_bad_arguments(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    /* a prompt longer than the 512-token context */
    char *prompt = malloc(8192);
    prompt[0] = 0;
    for (int i = 0; i < 600; i++)
        strcat(prompt, "cat ");
    char *a1[] = {"generate", "-m", model, "-p", prompt, "-n", "1", NULL};
    run_shardlm(r, a1, NULL);
    expect_failure(r, "longer than the context of 512");
    char *a2[] = {"generate", "-m", model, "-p", "Once", "-n", "600", NULL};
    run_shardlm(r, a2, NULL);
    expect_failure(r, "exceeds the context of 512");
    char *a3[] = {"generate", "-m", model, "-p", "Once", "-n", "x", NULL};
    run_shardlm(r, a3, NULL);
    expect_failure(r, "-n 'x'");
    char *a4[] = {"generate", "-m", model, "-p", "Once", "--top-p", "1.5", NULL};
    run_shardlm(r, a4, NULL);
    expect_failure(r, "--top-p");
    char *a5[] = {"frobnicate", NULL};
    run_shardlm(r, a5, NULL);
    expect_failure(r, "unknown command");
    char *a6[] = {"generate", "--help", NULL};
    run_shardlm(r, a6, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "--temp"));
    free(prompt);
    free(r);
}

/* The worker cannot be started (missing binary), or starts and dies before Hello. */
static void test_worker_fails_to_start(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    char *args[] = {"generate", "-m", model, "-p", "Once", "-n", "4", NULL};
    char *e1[] = {"SHARDLM_WORKER=/nonexistent/shardlm-worker", NULL};
    run_shardlm(r, args, e1);
    expect_failure(r, "cannot start worker /nonexistent/shardlm-worker");
    char *e2[] = {"SHARDLM_WORKER=/bin/false", NULL};
    run_shardlm(r, args, e2);
    expect_failure(r, "exited with status 1");
    /* a worker that runs but never connects: the Hello timeout fires and it is killed */
    char script[4200], env3[4300];
    tu_path(script, sizeof(script), "%s/silent-worker.sh", dir);
    const char body[] = "#!/bin/sh\nexec sleep 60\n";
    assert_int_equal(tu_write(script, body, sizeof(body) - 1), 0);
    chmod(script, 0700);
    tu_path(env3, sizeof(env3), "SHARDLM_WORKER=%s", script);
    char *e3[] = {env3, NULL};
    run_shardlm(r, args, e3);
    expect_failure(r, "did not say Hello");
    free(r);
}

static void send_signal_later(pid_t pid, void *arg)
{
    wait_worker_attached();
    usleep(200 * 1000);
    kill(pid, *(int *)arg);
}

/* SIGINT or SIGTERM during generation: exit 130 / 143 with the text so far and a final newline,
 * nothing left. */
static void test_sigint_stops_cleanly(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200], said[64];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    /* the worker's fault hook slows each step to 20 ms, so 400 steps outlast the signal */
    char *argv[] = {(char *)tu_bin(), "generate", "-m", model, "-p", "Once upon a time", "-n",
                    "400", "--temp", "1", "--seed", "7", NULL};
    char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=20", NULL};
    static int sigs[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        tu_run_cmd(r, argv, env, 60, send_signal_later, &sigs[i]);
        assert_int_equal(r->status, 128 + sigs[i]);
        assert_non_null(strstr(r->out, "Once upon a time"));
        assert_true(r->out_len > 0 && r->out[r->out_len - 1] == '\n');
        snprintf(said, sizeof(said), "stopped by signal %d", sigs[i]);
        assert_non_null(strstr(r->err, said));
        assert_runtime_clean();
        assert_no_workers();
    }
    free(r);
}

struct worker_kill {
    int rc;        /* pkill's status: 0 once it killed the worker */
    time_t at;     /* when */
};

/* Kills the worker 500 ms after the start, or as soon after as it runs (a loaded host may not
 * have started it by then: pkill is tried again every 50 ms for up to 10 s). */
static void kill_worker_later(pid_t pid, void *arg)
{
    struct worker_kill *k = arg;
    char cmd[4400];
    usleep(500 * 1000);
    tu_path(cmd, sizeof(cmd), "pkill -9 -f '[s]hardlm-worker --endpoint ipc://%s/'", rundir);
    for (int i = 0; i < 200 && (k->rc = system(cmd)) != 0; i++)
        usleep(50 * 1000);
    k->at = time(NULL);
}

/* A worker killed during generation is reported (not waited on forever) and cleaned up. */
static void test_worker_dies_mid_generation(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    char *argv[] = {(char *)tu_bin(),   "generate", "-m",  model,    "-p",
                    "Once upon a time", "-n",       "400", "--temp", "0",
                    "--restarts",       "0",        NULL};
    char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=20", NULL};
    struct worker_kill k = {.rc = -1};
    tu_run_cmd(r, argv, env, 60, kill_worker_later, &k);
    assert_int_equal(k.rc, 0);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "was killed by signal 9"));
    /* from the kill, not the start (which a loaded host makes longer): 400 steps of 20 ms would
     * take 8 s */
    assert_true(time(NULL) - k.at < 5);
    assert_runtime_clean();
    assert_no_workers();
    free(r);
}

/* What shardlm can leave in /dev/shm: its default runtime directory, shardlm-<uid> (this test's
 * runs use their own SHARDLM_RUNTIME_DIR, checked by assert_runtime_clean). */
#define SHARDLM_SHM_ENTRIES "ls -A /dev/shm | grep '^shardlm' || true"

struct coord_kill {
    int rc;
    uint64_t at_ns;
    char foreign[64]; /* a file of "another program" in /dev/shm */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void kill_coordinator_later(pid_t pid, void *arg)
{
    struct coord_kill *k = arg;
    /* another program's file appears in /dev/shm meanwhile: not shardlm's, so not compared */
    int fd = open(k->foreign, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
    wait_worker_attached();
    usleep(200 * 1000);
    k->rc = kill(pid, SIGKILL);
    k->at_ns = mono_ns();
}

/* The coordinator killed (SIGKILL) in the middle of a generation with two workers: they exit by
 * themselves within 2 s (parent-death signal), shardlm's entries in /dev/shm are what they were
 * before (other programs' may come and go meanwhile), and the next start removes the dead
 * coordinator's run files (KV, exchange, socket). */
static void test_coordinator_dies(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200], before[8192], after[8192];
    tu_path(model, sizeof(model), "%s/w4a8g128.shlm", dir);
    tu_cmd_output(SHARDLM_SHM_ENTRIES, before, sizeof(before));
    char *argv[] = {(char *)tu_bin(),   "generate", "-m",  model,    "-p",
                    "Once upon a time", "-n",       "400", "--temp", "0",
                    "--cpus",           "0:0",      NULL};
    char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=20", NULL};
    struct coord_kill k = {.rc = -1};
    snprintf(k.foreign, sizeof(k.foreign), "/dev/shm/e2e-foreign-%d", (int)getpid());
    tu_run_cmd(r, argv, env, 60, kill_coordinator_later, &k);
    /* the workers hold the output pipes too: tu_run_cmd returned when the last one exited */
    double gone = (double)(mono_ns() - k.at_ns) / 1e9;
    fprintf(stderr, "coordinator killed: its workers were gone %.3f s later\n", gone);
    assert_int_equal(k.rc, 0);
    assert_int_equal(r->status, 128 + SIGKILL);
    assert_false(tu_workers_alive(rundir));
    assert_true(gone < 2.0);
    assert_true(tu_count_run_files(rundir) > 0); /* the dead one's KV, exchange, socket */
    char *gen[] = {"generate", "-m", model, "-p", "Once", "-n", "2", NULL};
    run_shardlm(r, gen, NULL);
    assert_int_equal(r->status, 0);
    assert_runtime_clean();
    tu_cmd_output(SHARDLM_SHM_ENTRIES, after, sizeof(after));
    unlink(k.foreign);
    assert_string_equal(before, after);
    free(r);
}

/* `shardlm bench -m` runs both tests per thread count and states its roofline, and with --batch
 * llama-batched-bench's rows; a thread count above the CPUs, a batch of 0 are refused. Speed itself
 * is not asserted here (shared, noisy machines). */
static void test_bench_model(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200];
    tu_path(model, sizeof(model), "%s/w4a8g128.shlm", dir);
    char *args[] = {"bench", "-m", model, "-p", "16", "-n", "8", "-r", "2", "-t", "1", NULL};
    run_shardlm(r, args, NULL);
    if (r->status)
        fprintf(stderr, "%s", r->err);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "| model"));
    assert_non_null(strstr(r->out, "pp16"));
    assert_non_null(strstr(r->out, "tg8"));
    assert_non_null(strstr(r->out, "of the roofline"));
    assert_runtime_clean();
    /* decode alone: its inputs are not the (empty) prompt's */
    char *a1[] = {"bench", "-m", model, "-p", "0", "-n", "8", "-r", "1", "-t", "1", NULL};
    run_shardlm(r, a1, NULL);
    if (r->status)
        fprintf(stderr, "%s", r->err);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "tg8"));
    assert_null(strstr(r->out, "pp0"));
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    char t[16];
    snprintf(t, sizeof(t), "%d", CPU_COUNT(&set) + 1);
    char *a2[] = {"bench", "-m", model, "-t", t, NULL};
    run_shardlm(r, a2, NULL);
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "more than the"));
    char *a3[] = {"bench", "-m", model, "-t", "x", NULL};
    run_shardlm(r, a3, NULL);
    assert_int_equal(r->status, 2);
    /* --batch: llama-batched-bench's table, a row per batch size, through KV slots of their own */
    char *b1[] = {"bench", "-m", model, "--batch", "1,3", "-p", "8",
                  "-n",    "4",  "-r",  "1",       "-t",  "1",  NULL};
    run_shardlm(r, b1, NULL);
    if (r->status)
        fprintf(stderr, "%s", r->err);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "S_TG t/s"));
    assert_non_null(strstr(r->out, "|     8 |     4 |   1 |     12 |"));
    assert_non_null(strstr(r->out, "|     8 |     4 |   3 |     36 |"));
    assert_runtime_clean();
    char *b2[] = {"bench", "-m", model, "--batch", "0", NULL};
    run_shardlm(r, b2, NULL);
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "--batch '0'"));
    char notmodel[4200];
    tu_path(notmodel, sizeof(notmodel), "%s/models/stories260K/tok512.bin", tu_src());
    char *a4[] = {"bench", "-m", notmodel, "-p", "4", "-n", "0", NULL};
    run_shardlm(r, a4, NULL);
    expect_failure(r, "not a .shlm file");
    assert_runtime_clean();
    free(r);
}

static bool cpu_has_amx(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    bool amx = false;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "flags", 5) && strstr(line, " amx_int8"))
            amx = true;
    if (f)
        fclose(f);
    return amx;
}

/* The weight path is printed at start and can be forced; a kernel table the CPU cannot run is
 * refused with what it needs, by the engine and by `bench kernels`. */
static void test_weight_path(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200];
    tu_path(model, sizeof(model), "%s/w4a8g128.shlm", dir);
    char *gen[] = {"generate", "-m", model, "-p", "Once", "-n", "4", NULL};
    run_shardlm(r, gen, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->err, "shardlm: weights w4a8 g128 in tiles, head int8; kernels"));
    char *ref_env[] = {"SHARDLM_ISA=ref", NULL};
    run_shardlm(r, gen, ref_env);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->err, "; kernels ref (cpu:"));
    if (cpu_has_amx()) {
        print_message("[          ] this CPU has AMX: the refusal of SHARDLM_ISA=amx is not "
                      "checked here\n");
    } else {
        char *amx_env[] = {"SHARDLM_ISA=amx", NULL};
        run_shardlm(r, gen, amx_env);
        expect_failure(r, "SHARDLM_ISA=amx: kernel table amx cannot run here: it needs AMX");
        char *bk[] = {"bench", "kernels", "--isa", "amx", NULL};
        run_shardlm(r, bk, NULL);
        expect_failure(r, "--isa amx: kernel table amx cannot run here");
    }
    char *bad_env[] = {"SHARDLM_ISA=sse9", NULL};
    run_shardlm(r, gen, bad_env);
    expect_failure(r, "unknown kernel table 'sse9'");
    /* convert without --scheme: the probe's choice, said on stderr */
    char ck[4200], tok[4200], out[4200];
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    tu_path(out, sizeof(out), "%s/probe.shlm", dir);
    char *cv[] = {"convert", ck, "--tokenizer", tok, "-o", out, "-q", NULL, NULL, NULL};
    run_shardlm(r, cv, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->err, cpu_has_amx() ? "shardlm convert: scheme w4a8 (AMX"
                                                 : "shardlm convert: scheme w4a16 (no AMX"));
    cv[7] = "--priority";
    cv[8] = "fidelity";
    run_shardlm(r, cv, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->err, "scheme w4a16 (--priority fidelity"));
    cv[8] = "fast";
    run_shardlm(r, cv, NULL);
    expect_failure(r, "--priority 'fast'");
    char *bk_help[] = {"bench", "kernels", "--help", NULL};
    run_shardlm(r, bk_help, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "GOP/s"));
    assert_runtime_clean();
    assert_no_workers();
    free(r);
}

/* Names of the persistent weights segments in the runtime directory, one per line; returns
 * how many. */
static int list_weights(char *out, size_t len)
{
    char cmd[4300];
    tu_path(cmd, sizeof(cmd), "ls -A '%s' 2>/dev/null | grep '^w-'", rundir);
    tu_cmd_output(cmd, out, len);
    int lines = 0;
    for (const char *c = out; *c; c++)
        lines += *c == '\n';
    return lines;
}

/* Warm starts: the first run builds persistent weights segments, the next maps them (same
 * text, --stats says so and ends with the line scripts read); a segment whose header was never
 * written (a load killed half way) is rebuilt; shm list / purge show and remove them;
 * --no-persist leaves nothing at all. */
static void test_warm_start(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200], names[4096], seg[4300];
    tu_path(model, sizeof(model), "%s/w4a16g64.shlm", dir);
    char *purge[] = {"shm", "purge", NULL}, *list[] = {"shm", "list", NULL};
    run_shardlm(r, purge, NULL);
    assert_int_equal(r->status, 0);
    assert_int_equal(list_weights(names, sizeof(names)), 0);

    /* cold, then warm: the same text */
    char *gen[] = {"generate", "-m", model,     "-p", "Once upon a time", "-n", "24",
                   "--temp",   "0",  "--stats", NULL};
    run_shardlm(r, gen, NULL);
    assert_int_equal(r->status, 0);
    static char cold[sizeof(r->out)];
    memcpy(cold, r->out, sizeof(cold));
    assert_non_null(strstr(r->err, "shardlm: load: 1 weights segment built from"));
    assert_non_null(strstr(r->err, "\nload segments_bytes="));
    assert_int_equal(list_weights(names, sizeof(names)), 1);
    run_shardlm(r, gen, NULL);
    assert_int_equal(r->status, 0);
    assert_string_equal(r->out, cold);
    assert_non_null(strstr(r->err, "found complete"));
    assert_null(strstr(r->err, "built from"));
    unsigned long long seg_bytes, anon;
    double secs;
    const char *last = strstr(r->err, "load segments_bytes=");
    assert_non_null(last);
    assert_int_equal(sscanf(last, "load segments_bytes=%llu peak_anon_bytes=%llu seconds=%lf",
                            &seg_bytes, &anon, &secs),
                     3);
    assert_true(seg_bytes > 0 && anon > 0 && secs > 0);
    assert_runtime_clean();

    /* a half-written segment: header zero, as a load killed before its last write leaves it */
    names[strcspn(names, "\n")] = 0;
    tu_path(seg, sizeof(seg), "%s/%s", rundir, names);
    int fd = open(seg, O_WRONLY);
    assert_true(fd >= 0);
    static const char zero[512];
    assert_int_equal(pwrite(fd, zero, sizeof(zero), 0), 512);
    close(fd);
    run_shardlm(r, list, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "incomplete"));
    run_shardlm(r, gen, NULL);
    assert_int_equal(r->status, 0);
    assert_string_equal(r->out, cold);
    assert_non_null(strstr(r->err, "rebuilding it"));
    assert_non_null(strstr(r->err, "built from"));
    run_shardlm(r, list, NULL);
    assert_non_null(strstr(r->out, "complete: model"));
    assert_null(strstr(r->out, "incomplete"));

    /* another layout is another segment; `load` builds without generating */
    char *load2[] = {"load", "-m", model, "--cpus", "0:0", NULL};
    run_shardlm(r, load2, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->err, "2 weights segments ready (2 built, 0 found complete)"));
    assert_int_equal(list_weights(names, sizeof(names)), 3);
    run_shardlm(r, purge, NULL);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "3 files removed"));
    assert_int_equal(list_weights(names, sizeof(names)), 0);

    /* --no-persist: memfds, nothing in the runtime directory, the same text */
    char *gen_np[] = {"generate", "-m", model,          "-p", "Once upon a time", "-n", "24",
                      "--temp",   "0",  "--no-persist", NULL};
    run_shardlm(r, gen_np, NULL);
    assert_int_equal(r->status, 0);
    assert_string_equal(r->out, cold);
    assert_int_equal(tu_count_files(rundir), 0);
    free(r);
}

/* No room for the segments (SHARDLM_SHM_LIMIT stands in for a small tmpfs): for the weights at
 * load, or for the KV cache as a sequence grows - a clear error, nothing left behind, and no
 * persistent segment marked complete. */
static void test_segments_enospc(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200], names[4096];
    tu_path(model, sizeof(model), "%s/w4a8g128.shlm", dir);
    char *gen[] = {"generate", "-m", model, "-p", "Once", "-n", "4", NULL};
    char *purge[] = {"shm", "purge", NULL}; /* no complete segment from an earlier test */
    run_shardlm(r, purge, NULL);
    assert_int_equal(r->status, 0);
    char *tiny[] = {"SHARDLM_SHM_LIMIT=100000", NULL}; /* the weights (~290 KB) do not fit */
    run_shardlm(r, gen, tiny);
    expect_failure(r, "No space left on device");
    assert_int_equal(list_weights(names, sizeof(names)), 0);
    /* the weights and the exchange fit (~411 KB), the first KV block (20 KB) does not: the
     * step is refused before a worker could touch memory that is not there */
    char *kv[] = {"SHARDLM_SHM_LIMIT=421000", NULL};
    char *gen_np[] = {"generate", "-m", model, "-p", "Once", "-n", "4", "--no-persist", NULL};
    run_shardlm(r, gen_np, kv);
    expect_failure(r, "KV cache of rank 0: no memory for block 0 in a memfd: No space left on "
                      "device");
    char *enough[] = {"SHARDLM_SHM_LIMIT=900000", NULL};
    run_shardlm(r, gen_np, enough);
    assert_int_equal(r->status, 0);
    char *bad_io[] = {"generate", "-m", model, "-p", "Once", "--io", "fast", NULL};
    run_shardlm(r, bad_io, NULL);
    expect_failure(r, "--io 'fast': expected auto, direct or buffered");
    free(r);
}

struct rogue {
    int port;
    char server_pub[41];
    int sent;
};

/* A peer with a key of its own (not the workers') connects while the coordinator runs. */
static void rogue_peer_later(pid_t pid, void *arg)
{
    struct rogue *g = arg;
    wait_worker_attached(); /* the coordinator listens: 60 steps of 15 ms follow */
    char pub[41], sec[41], ep[64];
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0; /* what it queued goes with it */
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_curve_keypair(pub, sec);
    proto_curve_client(s, g->server_pub, pub, sec);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, "rank-0", 6);
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", g->port);
    zmq_connect(s, ep);
    g->sent = zmq_send(s, "\x3a\x00", 2, ZMQ_DONTWAIT); /* a Hello as rank 0, if it got in */
    usleep(400 * 1000);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

/* TCP and CURVE: --listen tcp binds loopback and works; an address off loopback is refused
 * without keys; with `shardlm keygen` keys the workers get in, and a peer with another key is
 * refused and logged while the generation goes on. */
static void test_access(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200], keys[4200], path[4300];
    static char want[sizeof(r->out)];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    char *ref[] = {"generate", "-m",     model, "-p", "Once upon a time", "-n", "60", "--temp",
                   "0",        "--cpus", "0:0", NULL};
    run_shardlm(r, ref, NULL);
    assert_int_equal(r->status, 0);
    memcpy(want, r->out, sizeof(want));
    char *tcp[] = {"generate", "-m",       model,    "-p",        "Once upon a time",
                   "-n",       "60",       "--temp", "0",         "--cpus",
                   "0:0",      "--listen", "tcp",    "--verbose", NULL};
    run_shardlm(r, tcp, NULL);
    assert_int_equal(r->status, 0);
    assert_string_equal(r->out, want);
    assert_non_null(strstr(r->err, "coordinator listens on tcp://127.0.0.1:"));
    assert_runtime_clean();
    char *open_any[] = {"generate", "-m", model, "-p", "Once", "--listen", "tcp://0.0.0.0:0", NULL};
    run_shardlm(r, open_any, NULL);
    expect_failure(r, "an address other than loopback needs CURVE keys");

    tu_path(keys, sizeof(keys), "%s/keys", dir);
    char *kg[] = {"keygen", "-o", keys, NULL};
    run_shardlm(r, kg, NULL);
    assert_int_equal(r->status, 0);
    struct stat st;
    tu_path(path, sizeof(path), "%s/worker.key", keys);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(keys, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    run_shardlm(r, kg, NULL); /* never overwrites */
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "never overwritten"));

    struct rogue g = {.sent = -2};
    tu_path(path, sizeof(path), "%s/server.key", keys);
    assert_int_equal(proto_key_read(path, g.server_pub, NULL), 0);
    for (int attempt = 0; attempt < 3; attempt++) { /* a port someone else holds: another */
        g.port = 20000 + (int)((getpid() * 7 + attempt * 7919) % 30000);
        char ep[64];
        snprintf(ep, sizeof(ep), "tcp://0.0.0.0:%d", g.port);
        char *argv[] = {(char *)tu_bin(),
                        "generate",
                        "-m",
                        model,
                        "-p",
                        "Once upon a time",
                        "-n",
                        "60",
                        "--temp",
                        "0",
                        "--cpus",
                        "0:0",
                        "--listen",
                        ep,
                        "--keys",
                        keys,
                        NULL};
        char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=15", NULL};
        tu_run_cmd(r, argv, env, 60, rogue_peer_later, &g);
        if (!strstr(r->err, "Address already in use"))
            break;
    }
    if (r->status)
        fprintf(stderr, "%s", r->err);
    assert_int_equal(r->status, 0);
    assert_string_equal(r->out, want);
    assert_non_null(strstr(r->err, "shardlm: refused a peer from 127.0.0.1"));
    assert_runtime_clean();
    assert_no_workers();
    free(r);
}

/* The golden continuation of prompt @no (its text after the prompt), malloc'd. */
static char *golden_tail(int no, const char *prompt)
{
    char *g = tu_golden_tail(tu_data(), no, prompt);
    assert_non_null(g);
    return g;
}

/* Many prompts at once: the four golden prompts batched (-p four times, and -f FILE with
 * --json) each continue as they do alone, greedy; results come labelled in prompt order or as
 * one JSON object per line; a stop string ends a text before it; a prompt sharing a long prefix
 * with an earlier one finds it cached and continues the same; bad sizes and files fail in one
 * line. */
static void test_generate_many(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char model[4200], file[4200], prompts[4][512], *tail[4];
    int n_ids[4];
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    tu_path(file, sizeof(file), "%s/prompts.txt", dir);
    char listing[4096] = "";
    for (int i = 0; i < 4; i++) {
        assert_int_equal(
            tu_golden_prompt(tu_data(), i + 1, prompts[i], sizeof(prompts[i]), &n_ids[i]), 0);
        tail[i] = golden_tail(i + 1, prompts[i]);
        strcat(listing, prompts[i]);
        /* a CRLF and an empty line; no newline after the last */
        strcat(listing, i == 1 ? "\r\n\n" : i == 3 ? "" : "\n");
    }
    assert_int_equal(tu_write(file, listing, strlen(listing)), 0);
    /* 100 new tokens: every golden text has more, or stops earlier at EOS */
    char *a1[] = {"generate", "-m", model,      "-n", "100",      "--temp", "0",        "-p",
                  prompts[0], "-p", prompts[1], "-p", prompts[2], "-p",     prompts[3], NULL};
    run_shardlm(r, a1, NULL);
    assert_int_equal(r->status, 0);
    const char *at = r->out;
    for (int i = 0; i < 4; i++) {
        char head[600];
        snprintf(head, sizeof(head), "[%d] %s", i + 1, prompts[i]);
        assert_int_equal(strncmp(at, head, strlen(head)), 0);
        at += strlen(head);
        const char *end = strstr(at, i < 3 ? "\n[" : "\n");
        assert_non_null(end);
        size_t got = (size_t)(end - at);
        if (strncmp(at, tail[i], got) != 0)
            fail_msg("prompt %d batched:\n%.*s\nalone:\n%s", i + 1, (int)got, at, tail[i]);
        at = end + 1;
    }
    assert_runtime_clean();

    char *a2[] = {"generate", "-m", model, "-n", "100", "--temp", "0", "-f", file, "--json", NULL};
    run_shardlm(r, a2, NULL);
    assert_int_equal(r->status, 0);
    char *line = r->out;
    for (int i = 0; i < 4; i++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        const char *text = json_string_value(json_object_get(o, "text"));
        const char *fin = json_string_value(json_object_get(o, "finish_reason"));
        assert_string_equal(json_string_value(json_object_get(o, "prompt")), prompts[i]);
        assert_non_null(text);
        assert_int_equal(strncmp(text, tail[i], strlen(text)), 0);
        assert_int_equal(json_integer_value(json_object_get(o, "prompt_tokens")), n_ids[i]);
        json_int_t done = json_integer_value(json_object_get(o, "completion_tokens"));
        assert_true(done >= 1 && done <= 100);
        assert_true(strcmp(fin, done == 100 ? "length" : "stop") == 0);
        json_decref(o);
        line = nl + 1;
    }
    assert_int_equal(*line, '\0');

    /* a stop string: the text ends before its first occurrence */
    char *a3[] = {"generate", "-m",       model,    "-n",     "100", "--temp", "0",
                  "-p",       prompts[0], "--json", "--stop", ".",   NULL};
    run_shardlm(r, a3, NULL);
    assert_int_equal(r->status, 0);
    json_error_t je;
    json_t *o = json_loads(r->out, 0, &je);
    assert_non_null(o);
    const char *text = json_string_value(json_object_get(o, "text"));
    assert_int_equal(strlen(text), strcspn(tail[0], "."));
    assert_int_equal(strncmp(text, tail[0], strlen(text)), 0);
    assert_string_equal(json_string_value(json_object_get(o, "finish_reason")), "stop");
    json_decref(o);

    /* one sequence at a time: the second prompt extends the first, whose full blocks it finds
     * in the prefix cache; its text is the one computed without the cache */
    char base[1024], longer[1040];
    snprintf(base, sizeof(base), "%s%.300s", prompts[0], tail[0]); /* ~80 tokens */
    snprintf(longer, sizeof(longer), "%s%s", base, " The end.");
    char *a4[] = {"generate",   "-m", model, "-n", "40", "--temp", "0", "--json",
                  "--max-seqs", "1",  "-p",  base, "-p", longer,   NULL};
    char texts[2][4096];
    for (int cache = 1; cache >= 0; cache--) {
        char *args[20];
        int k = 0;
        for (; a4[k]; k++)
            args[k] = a4[k];
        if (!cache)
            args[k++] = "--no-prefix-cache";
        args[k] = NULL;
        run_shardlm(r, args, NULL);
        assert_int_equal(r->status, 0);
        char *second = strchr(r->out, '\n') + 1;
        o = json_loads(second, JSON_DISABLE_EOF_CHECK, &je);
        assert_non_null(o);
        json_int_t cached = json_integer_value(json_object_get(o, "cached_tokens"));
        if (cache)
            assert_true(cached >= 16 && cached % 16 == 0);
        else
            assert_int_equal(cached, 0);
        snprintf(texts[cache], sizeof(texts[cache]), "%s",
                 json_string_value(json_object_get(o, "text")));
        json_decref(o);
    }
    assert_string_equal(texts[0], texts[1]);

    /* sizes and files that cannot work */
    char empty[4200], bad_utf8[4200];
    tu_path(empty, sizeof(empty), "%s/empty.txt", dir);
    tu_path(bad_utf8, sizeof(bad_utf8), "%s/latin1.txt", dir);
    assert_int_equal(tu_write(empty, "\n\n", 2), 0);
    assert_int_equal(tu_write(bad_utf8, "Once\ncaf\xe9\n", 10), 0);
    struct {
        char *args[16];
        const char *err;
    } bad[] = {
        {{"generate", "-m", model, "-f", "/nonexistent/prompts", NULL}, "No such file"},
        {{"generate", "-m", model, "-f", empty, NULL}, "holds no prompt"},
        {{"generate", "-m", model, "-f", bad_utf8, NULL}, "prompt 2: not valid UTF-8"},
        {{"generate", "-m", model, "-p", "Once", "--kv-tokens", "64", "--kv-mem", "1M", NULL},
         "give one"},
        {{"generate", "-m", model, "-p", "Once", "--kv-tokens", "32", "--max-seqs", "4", NULL},
         "cannot give each of 4 sequences one"},
        {{"generate", "-m", model, "-p", "Once", "--kv-tokens", "64", "-n", "100", NULL},
         "needs 7 KV blocks"},
        {{"generate", "-m", model, "-p", "Once", "-p", "Twice", "--max-seqs", "2", "--step-tokens",
          "1", NULL},
         "--step-tokens 1 is below --max-seqs 2"},
        {{"generate", "-m", model, "-p", "Once", "--kv-mem", "12X", NULL}, "--kv-mem '12X'"},
        {{"generate", "-m", model, "-p", "Once", "--top-k", "-1", NULL}, "--top-k '-1'"},
        {{"generate", "-m", model, "-p", "Once", "--stop", "", NULL}, "--stop"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        run_shardlm(r, bad[i].args, NULL);
        expect_failure(r, bad[i].err);
    }
    for (int i = 0; i < 4; i++)
        free(tail[i]);
    free(r);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_greedy_f32),
        cmocka_unit_test(test_generate_many),
        cmocka_unit_test(test_eval_fidelity),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_bad_model_files),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_worker_fails_to_start),
        cmocka_unit_test(test_sigint_stops_cleanly),
        cmocka_unit_test(test_worker_dies_mid_generation),
        cmocka_unit_test(test_coordinator_dies),
        cmocka_unit_test(test_bench_model),
        cmocka_unit_test(test_weight_path),
        cmocka_unit_test(test_warm_start),
        cmocka_unit_test(test_segments_enospc),
        cmocka_unit_test(test_access),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
