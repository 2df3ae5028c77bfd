/* SPDX-License-Identifier: MIT */
/* End-to-end: what a careless or hostile user does to the files around shardlm. Each case is a
 * rule tested on several instances:
 *
 * outputs:  `convert -o` and `synth -o` replace only a regular file that is none of the inputs
 *           (a device, FIFO, folder or symbolic link is refused and left as it was; the input
 *           by its own path, another path or a hard link is refused and left intact);
 * eval:     --save never writes into the reference folder (by any path), never replaces a file
 *           without --overwrite, nor anything but a regular file; a reference cut short, padded
 *           or holding a NaN is refused;
 * FIFOs:    every command given a FIFO where it reads a file fails at once, naming it;
 * runtime:  shm purge keeps the weights segment a live engine maps (engines that start while
 *           purge runs in a loop all succeed), and nothing whose name is not exactly one of
 *           ours is listed as ours or removed, by purge or by an engine's start-up cleanup;
 * signals:  SIGTERM stops generate and bench soon, with exit code 143, leaving nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <time.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "shlm.h"
#include "testutil.h"

static char dir[4096];    /* this test's files */
static char rundir[4200]; /* SHARDLM_RUNTIME_DIR of every run */
static char env_rundir[4300];
static char model[4300]; /* stories260K at f32 */

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "misuse");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(env_rundir, sizeof(env_rundir), "SHARDLM_RUNTIME_DIR=%s", rundir);
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    return tu_convert(model, "f32", NULL) ? -1 : 0;
}

static int teardown(void **state)
{
    char mnt[4300]; /* the tmpfs mounts of cases that failed before unmounting them */
    tu_path(mnt, sizeof(mnt), "%s/full", dir);
    umount2(mnt, MNT_DETACH);
    tu_path(mnt, sizeof(mnt), "%s/kvroom", dir);
    umount2(mnt, MNT_DETACH);
    tu_rmdir(dir);
    return 0;
}

static void run(struct tu_run *r, char *const args[])
{
    tu_run_shardlm(r, env_rundir, args, NULL, 60, NULL, NULL);
}

/* Expects a failure (exit 1 or 2) within the run's timeout, with @needle on stderr. */
static void expect_refused(const struct tu_run *r, const char *needle)
{
    if ((r->status != 1 && r->status != 2) || !strstr(r->err, needle))
        fprintf(stderr, "status %d, stderr: %s(wanted '%s')\n", r->status, r->err, needle);
    assert_true(r->status == 1 || r->status == 2);
    assert_non_null(strstr(r->err, needle));
}

/* @name in this test's folder, into @buf. */
static char *in_dir(char *buf, size_t len, const char *name)
{
    tu_path(buf, len, "%s/%s", dir, name);
    return buf;
}

/* Entries of @d whose name has ".tmp." in it: an output's temporary file left behind. */
static int count_tmp(const char *d)
{
    char cmd[4400], out[32];
    tu_path(cmd, sizeof(cmd), "ls -A '%s' | grep -c '\\.tmp\\.'", d);
    tu_cmd_output(cmd, out, sizeof(out));
    return atoi(out);
}

static void test_outputs_replace_only_regular_files(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char ck[4200], tok[4200], p[4300];
    /* private copies of the inputs: a broken rule must not destroy the repository's files */
    tu_path(p, sizeof(p),
            "cp '%s/models/stories260K/stories260K.bin' '%s/in.bin' && cp "
            "'%s/models/stories260K/tok512.bin' '%s/tok.bin'",
            tu_src(), dir, tu_src(), dir);
    assert_int_equal(system(p), 0);
    in_dir(ck, sizeof(ck), "in.bin");
    in_dir(tok, sizeof(tok), "tok.bin");
    size_t ck_len = 0, tok_len = 0;
    char *ck_bytes = tu_slurp(ck, &ck_len), *tok_bytes = tu_slurp(tok, &tok_len);
    assert_non_null(ck_bytes);
    assert_non_null(tok_bytes);

    /* not regular files: each refused, and still what it was */
    struct {
        const char *name;
        mode_t type;
    } odd[] = {{"fifo", S_IFIFO}, {"folder", S_IFDIR}, {"link", S_IFLNK}, {"dev", S_IFCHR}};
    int n_odd = 4;
    assert_int_equal(mkfifo(in_dir(p, sizeof(p), "fifo"), 0600), 0);
    assert_int_equal(mkdir(in_dir(p, sizeof(p), "folder"), 0700), 0);
    assert_int_equal(symlink(ck, in_dir(p, sizeof(p), "link")), 0);
    if (mknod(in_dir(p, sizeof(p), "dev"), S_IFCHR | 0600, makedev(1, 3)) < 0) {
        print_message("no device node (mknod: %s, needs root): the other kinds only\n",
                      strerror(errno));
        n_odd = 3;
    }
    for (int i = 0; i < n_odd; i++) {
        char out[4300];
        in_dir(out, sizeof(out), odd[i].name);
        char *conv[] = {"convert", ck,   "--tokenizer", tok, "--scheme",
                        "f32",     "-q", "-o",          out, NULL};
        char *synth[] = {"synth", "--shape", "tiny", "-o", out, NULL};
        char *const *cmds[] = {conv, synth};
        for (int c = 0; c < 2; c++) {
            run(r, cmds[c]);
            expect_refused(r, "an output replaces only a regular file");
            struct stat st;
            assert_int_equal(lstat(out, &st), 0);
            assert_int_equal(st.st_mode & S_IFMT, odd[i].type);
        }
    }

    /* an empty output path: refused before the conversion, not at its rename - a usage error,
     * as every empty path is (it was exit 1 "an empty output path", after the scheme probe) */
    char *empty[] = {"convert", ck, "--tokenizer", tok, "--scheme", "f32", "-q", "-o", "", NULL};
    run(r, empty);
    expect_refused(r, "-o '': expected a path");
    assert_int_equal(r->status, 2);

    /* an input as the output, by its own path, another path or a hard link: refused, intact */
    char other[4300], hard[4300];
    tu_path(other, sizeof(other), "%s/folder/../in.bin", dir);
    in_dir(hard, sizeof(hard), "hard.bin");
    assert_int_equal(link(ck, hard), 0);
    const char *same[] = {ck, other, hard, tok};
    for (int i = 0; i < 4; i++) {
        char *conv[] = {"convert", ck,   "--tokenizer",   tok, "--scheme", "f32",
                        "-q",      "-o", (char *)same[i], NULL};
        run(r, conv);
        expect_refused(r, "is the input");
    }
    /* a GGUF input too (another source format) */
    char gguf[4300];
    in_dir(gguf, sizeof(gguf), "tiny.gguf");
    char *synth[] = {"synth", "--shape", "tiny", "-o", gguf, NULL};
    run(r, synth);
    assert_int_equal(r->status, 0);
    char *conv_gguf[] = {"convert", gguf, "--scheme", "f32", "-q", "-o", gguf, NULL};
    run(r, conv_gguf);
    expect_refused(r, "is the input");

    size_t len = 0;
    char *now = tu_slurp(ck, &len);
    assert_true(len == ck_len && memcmp(now, ck_bytes, len) == 0);
    free(now);
    now = tu_slurp(tok, &len);
    assert_true(len == tok_len && memcmp(now, tok_bytes, len) == 0);
    free(now);

    /* a regular file that is no input is replaced, as before */
    char out[4300];
    in_dir(out, sizeof(out), "out.shlm");
    assert_int_equal(tu_write(out, "old", 3), 0);
    char *conv[] = {"convert", ck, "--tokenizer", tok, "--scheme", "f32", "-q", "-o", out, NULL};
    run(r, conv);
    assert_int_equal(r->status, 0);
    struct stat st;
    assert_int_equal(stat(out, &st), 0);
    assert_true(st.st_size > 4096);
    assert_int_equal(count_tmp(dir), 0);
    free(ck_bytes);
    free(tok_bytes);
    free(r);
}

/* Copies the golden reference folder to @to. */
static void copy_ref(const char *to)
{
    char cmd[8400];
    tu_path(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s/golden/stories260K' '%s'", to, tu_data(),
            to);
    assert_int_equal(system(cmd), 0);
}

static void test_eval_save_and_reference(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char ref[4300], save[4300], alias[4300], p[4400];
    in_dir(ref, sizeof(ref), "ref");
    in_dir(save, sizeof(save), "save");
    in_dir(alias, sizeof(alias), "ref-alias");
    copy_ref(ref);
    assert_int_equal(symlink(ref, alias), 0);
    tu_path(p, sizeof(p), "%s/p1.logits.f32", ref);
    size_t ref_len = 0;
    char *ref_bytes = tu_slurp(p, &ref_len);
    assert_non_null(ref_bytes);

    /* --save into the reference folder, by its path or another: refused, the reference intact */
    const char *into[] = {ref, alias};
    for (int i = 0; i < 2; i++) {
        char *args[] = {"eval",          "-m",           model, "--ref", ref, "--save",
                        (char *)into[i], "--no-persist", NULL};
        run(r, args);
        expect_refused(r, "is the reference folder");
    }
    size_t len = 0;
    char *now = tu_slurp(p, &len);
    assert_true(len == ref_len && memcmp(now, ref_bytes, len) == 0);
    free(now);

    /* a failed eval leaves no --save folder it made */
    char *no_model[] = {"eval", "-m", "/nonexistent.shlm", "--ref", ref, "--save", save, NULL};
    run(r, no_model);
    expect_refused(r, "No such file");
    assert_int_equal(access(save, F_OK), -1);
    /* a fresh folder is written; a second run refuses to replace it unless --overwrite */
    char *args[] = {"eval", "-m", model, "--ref", ref, "--save", save, "--no-persist", NULL, NULL};
    run(r, args);
    assert_int_equal(r->status, 0);
    run(r, args);
    expect_refused(r, "exists (--overwrite replaces it)");
    args[8] = "--overwrite";
    run(r, args);
    assert_int_equal(r->status, 0);
    /* what it saved is a reference: this model against itself */
    char *again[] = {"eval", "-m", model, "--ref", save, "--no-persist", NULL};
    run(r, again);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "overall kld=0 top1=1.0000"));
    /* even --overwrite replaces only a regular file */
    tu_path(p, sizeof(p), "%s/p2.logits.f32", save);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    run(r, args);
    expect_refused(r, "a FIFO; an output replaces only a regular file");
    assert_int_equal(count_tmp(save), 0);

    /* references cut short by whole rows, padded by one, or holding a NaN */
    tu_path(p, sizeof(p), "%s/p1.logits.f32", ref);
    char *ev[] = {"eval", "-m", model, "--ref", ref, "--no-persist", NULL};
    size_t row = 512 * sizeof(float);
    assert_int_equal(tu_write(p, ref_bytes, 10 * row), 0);
    run(r, ev);
    expect_refused(r, "expected 257 or 256 rows of 512 float32 logits");
    char *padded = calloc(1, ref_len + 2 * row);
    memcpy(padded, ref_bytes, ref_len);
    assert_int_equal(tu_write(p, padded, ref_len + 2 * row), 0);
    run(r, ev);
    expect_refused(r, "expected 257 or 256 rows of 512 float32 logits");
    assert_int_equal(tu_write(p, padded, ref_len + row), 0); /* a row too many is padding */
    run(r, ev);
    expect_refused(r, "row 256 holds one value, 0, in every logit (padding?)");
    float nan_value = NAN;
    memcpy(padded + 3 * row + 8, &nan_value, sizeof(float));
    assert_int_equal(tu_write(p, padded, ref_len), 0);
    run(r, ev);
    expect_refused(r, "row 3, logit 2 is nan");
    free(padded);
    free(ref_bytes);
    free(r);
}

/* eval's relative L2 distance and the reference's top-1 probability, on a reference whose
 * figures are known: this model's own logits (--save), row r of each file scaled by
 * f = 1 + 0.001 (r % 10). Softmax does not forgive a scale, so the KLD is above 0, and each
 * position's ||model - ref|| / ||ref|| is (f - 1) / f exactly: largest 0.009 / 1.009. */
static void test_eval_rel_l2(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char self[4300], scaled[4300], p[4400], q[4400];
    in_dir(self, sizeof(self), "self");
    in_dir(scaled, sizeof(scaled), "scaled");
    tu_path(p, sizeof(p), "%s/golden/stories260K", tu_data());
    char *args[] = {"eval", "-m", model, "--ref", self, "--no-persist", NULL};
    char *save[] = {"eval", "-m", model, "--ref", p, "--save", self, "--no-persist", NULL};
    run(r, save);
    assert_int_equal(r->status, 0);
    run(r, args);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "overall kld=0 top1=1.0000 "));
    assert_non_null(strstr(r->out, " rel_l2_max=0 rel_l2_p99=0 ref_top1_prob="));

    assert_int_equal(mkdir(scaled, 0755), 0);
    tu_path(p, sizeof(p), "%s/greedy.tsv", self);
    tu_path(q, sizeof(q), "%s/greedy.tsv", scaled);
    size_t len = 0;
    char *tsv = tu_slurp(p, &len);
    assert_int_equal(tu_write(q, tsv, len), 0);
    free(tsv);
    const int vocab = 512;
    double p1 = 0.0; /* the scaled reference's top-1 probabilities, summed */
    long rows = 0;
    for (int i = 1; i <= 4; i++) {
        tu_path(p, sizeof(p), "%s/p%d.logits.f32", self, i);
        tu_path(q, sizeof(q), "%s/p%d.logits.f32", scaled, i);
        float *x = (float *)tu_slurp(p, &len);
        assert_non_null(x);
        for (size_t row = 0; row < len / (vocab * sizeof(float)); row++, rows++) {
            float f = 1.0f + 0.001f * (float)(row % 10), *y = x + row * vocab;
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < vocab; j++) {
                y[j] *= f;
                mx = y[j] > mx ? y[j] : mx;
            }
            for (int j = 0; j < vocab; j++)
                sum += exp(y[j] - mx);
            p1 += 1.0 / sum;
        }
        assert_int_equal(tu_write(q, x, len), 0);
        free(x);
    }
    args[4] = scaled;
    run(r, args);
    assert_int_equal(r->status, 0);
    double kld, top1, ppl, kld99, l2max, l2p99, refp;
    const char *last = strstr(r->out, "overall ");
    assert_non_null(last);
    assert_int_equal(sscanf(last,
                            "overall kld=%lf top1=%lf ppl=%lf kld_p99=%lf rel_l2_max=%lf "
                            "rel_l2_p99=%lf ref_top1_prob=%lf",
                            &kld, &top1, &ppl, &kld99, &l2max, &l2p99, &refp),
                     7);
    /* f is a float: (f - 1) / f within 1e-6 of the decimal figure; %.6g and %.4f printed */
    assert_true(kld > 0.0);
    assert_true(fabs(l2max - 0.009 / 1.009) < 1e-6);
    assert_true(fabs(l2p99 - 0.009 / 1.009) < 1e-6); /* a tenth of the rows have the largest */
    assert_true(fabs(refp - p1 / (double)rows) <= 0.00006);
    free(r);
}

/* @model with every element of output_norm set to @v, its checksums made good again: a model
 * convert refuses to write, as an older convert or a hand would have made it. */
static void poisoned_model(const char *to, float v)
{
    size_t len = 0;
    uint8_t *b = (uint8_t *)tu_slurp(model, &len);
    assert_non_null(b);
    struct shlm_model m;
    struct shardlm_err e;
    assert_int_equal(shlm_parse(&m, b, len, model, &e), 0);
    struct shlm_tensor *t = (struct shlm_tensor *)shlm_find(&m, "output_norm");
    assert_non_null(t);
    assert_int_equal(t->dtype, KN_DT_F32);
    for (uint32_t j = 0; j < t->cols; j++)
        memcpy(b + t->offset + 4 * j, &v, 4);
    t->checksum = shlm_hash(b + t->offset, t->bytes);
    shlm_seal((struct shlm_header *)m.hdr, m.tensors);
    assert_int_equal(tu_write(to, b, len), 0);
    free(b);
}

/* A model whose logits are NaN or overflow: eval fails with one line (never "kld=nan" and
 * exit 0), and --save writes nothing eval would refuse to read back. */
static void test_eval_non_finite(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char ref[4300], save[4300], bad[4300];
    in_dir(ref, sizeof(ref), "ref-nf");
    in_dir(save, sizeof(save), "save-nf");
    in_dir(bad, sizeof(bad), "poisoned.shlm");
    copy_ref(ref);
    static const float values[] = {NAN, 3e38f};
    for (int i = 0; i < 2; i++) {
        poisoned_model(bad, values[i]);
        char *ev[] = {"eval", "-m", bad, "--ref", ref, "--no-persist", NULL};
        run(r, ev);
        expect_refused(r, "the model's logits: row 0, logit 0 is");
        assert_null(strstr(r->out, "overall"));
        char *sv[] = {"eval", "-m", bad, "--ref", ref, "--save", save, "--no-persist", NULL};
        run(r, sv);
        expect_refused(r, "the model's logits");
        assert_int_equal(access(save, F_OK), -1);
    }
    unlink(bad);
    free(r);
}

/* A FIFO where any command reads a file: a prompt failure naming it, never a wait for a writer
 * (the runs' timeout, 60 s, would show as status -1). */
static void test_fifo_arguments(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char fifo[4300], ref[4300], ck[4300], tok[4300], keys[4300], p[4400];
    in_dir(fifo, sizeof(fifo), "a-fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    /* a reference folder whose greedy.tsv, then whose logits file, is a FIFO */
    in_dir(ref, sizeof(ref), "fifo-ref");
    copy_ref(ref);
    /* a keys folder whose key is a FIFO */
    in_dir(keys, sizeof(keys), "fifo-keys");
    char *keygen[] = {"keygen", "-o", keys, NULL};
    run(r, keygen);
    assert_int_equal(r->status, 0);
    tu_path(p, sizeof(p), "%s/worker.key", keys);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);

    char *cases[][12] = {
        {"generate", "-m", fifo, "-p", "hi", NULL},
        {"load", "-m", fifo, NULL},
        {"bench", "-m", fifo, "-p", "8", "-n", "4", NULL},
        {"eval", "-m", fifo, "--ref", ref, NULL},
        {"inspect", fifo, NULL},
        {"tokenize", "--tokenizer", fifo, "hi", NULL},
        {"convert", fifo, "--scheme", "f32", "-o", p, NULL},
        {"convert", ck, "--tokenizer", fifo, "--scheme", "f32", "-o", p, NULL},
        {"generate", "-m", model, "-p", "hi", "--listen", "tcp", "--keys", keys, "--no-persist",
         NULL},
    };
    in_dir(p, sizeof(p), "never.shlm");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tu_run_shardlm(r, env_rundir, cases[i], NULL, 10, NULL, NULL);
        if (r->status == -1)
            fprintf(stderr, "shardlm %s ... %s: still waiting after 10 s\n", cases[i][0],
                    cases[i][2]);
        expect_refused(r, "FIFO");
    }
    /* eval's reference files */
    const char *ref_files[] = {"greedy.tsv", "p1.logits.f32"};
    for (int i = 0; i < 2; i++) {
        char f[4400];
        tu_path(f, sizeof(f), "%s/%s", ref, ref_files[i]);
        assert_int_equal(unlink(f), 0);
        assert_int_equal(mkfifo(f, 0600), 0);
        char *ev[] = {"eval", "-m", model, "--ref", ref, "--no-persist", NULL};
        run(r, ev);
        expect_refused(r, "FIFO");
        if (i == 0) { /* back to a real greedy.tsv for the second case */
            unlink(f);
            char cmd[8800];
            tu_path(cmd, sizeof(cmd), "cp '%s/golden/stories260K/greedy.tsv' '%s'", tu_data(), f);
            assert_int_equal(system(cmd), 0);
        }
    }
    free(r);
}

/* Expects exit 1 within the run's timeout and exactly one line on stderr, holding @needle. */
static void expect_one_line(const struct tu_run *r, const char *needle)
{
    int lines = 0;
    for (size_t i = 0; i < r->err_len; i++)
        lines += r->err[i] == '\n';
    if (r->status != 1 || lines != 1 || !strstr(r->err, needle))
        fprintf(stderr, "status %d, stderr: %s(wanted one line with '%s')\n", r->status, r->err,
                needle);
    assert_int_equal(r->status, 1);
    assert_int_equal(lines, 1);
    assert_non_null(strstr(r->err, needle));
}

/* synth --hf DIR and --tokenizer DIR given a FIFO or a device as the folder, or as a file in it,
 * and a tokenizer.json past the bound (256 MiB, sparse): each refused at once in one line naming
 * it, nothing written, the odd file left as it was. (--hf wrote config.json and the tokenizer's
 * files before refusing a FIFO model.safetensors; --tokenizer FIFO said "FIFO/tokenizer.json: Not
 * a directory"; a 300 MiB tokenizer.json was read whole, then refused by the JSON parser.) */
static void test_synth_folders(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char fifo[4300], dev[4300], hf[4300], src[4300], tokd[4300], out[4300], p[4400], f[4400];
    in_dir(fifo, sizeof(fifo), "sf-fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    bool have_dev = mknod(in_dir(dev, sizeof(dev), "sf-dev"), S_IFCHR | 0600, makedev(1, 3)) == 0;
    in_dir(hf, sizeof(hf), "sf-hf");
    in_dir(src, sizeof(src), "sf-src");
    in_dir(tokd, sizeof(tokd), "sf-tok");
    in_dir(out, sizeof(out), "sf-out.gguf");
    const char *odd[] = {fifo, have_dev ? dev : NULL};
    const mode_t odd_type[] = {S_IFIFO, S_IFCHR};
    struct stat st;
    for (int i = 0; i < 2 && odd[i]; i++) {
        char *as_hf[] = {"synth", "--shape", "tiny-qwen3", "--hf", (char *)odd[i], NULL};
        char *as_tok[] = {"synth",        "--shape", "tiny-qwen3", "--tokenizer",
                          (char *)odd[i], "-o",      out,          NULL};
        char *const *cmds[] = {as_hf, as_tok};
        for (int c = 0; c < 2; c++) {
            tu_run_shardlm(r, env_rundir, cmds[c], NULL, 10, NULL, NULL);
            expect_one_line(r, ", not a folder");
            assert_int_equal(lstat(odd[i], &st), 0);
            assert_int_equal(st.st_mode & S_IFMT, odd_type[i]);
            assert_int_equal(access(out, F_OK), -1);
        }
    }
    /* each file synth --hf writes, a FIFO in turn: refused before any is written */
    static const char *const names[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                        "model.safetensors"};
    for (int i = 0; i < 4; i++) {
        tu_path(p, sizeof(p), "rm -rf '%s' && mkdir '%s'", hf, hf);
        assert_int_equal(system(p), 0);
        tu_path(f, sizeof(f), "%s/%s", hf, names[i]);
        assert_int_equal(mkfifo(f, 0600), 0);
        char *synth[] = {"synth", "--shape", "tiny-qwen3", "--hf", hf, NULL};
        tu_run_shardlm(r, env_rundir, synth, NULL, 10, NULL, NULL);
        tu_path(p, sizeof(p), "%s: a FIFO; an output replaces only a regular file", f);
        expect_one_line(r, p);
        assert_int_equal(tu_count_files(hf), 1);
        assert_int_equal(lstat(f, &st), 0);
        assert_true(S_ISFIFO(st.st_mode));
    }
    /* a tokenizer folder whose tokenizer.json, then tokenizer_config.json, is a FIFO */
    char *mk[] = {"synth", "--shape", "tiny-qwen3", "--type", "f32", "--hf", src, NULL};
    tu_run_shardlm(r, env_rundir, mk, NULL, 60, NULL, NULL);
    assert_int_equal(r->status, 0);
    /* a Hugging Face folder's own files as convert's output (by their path, a symbolic link
     * to one): refused, intact */
    for (int i = 0; i < 4; i += 3) {
        tu_path(f, sizeof(f), "%s/%s", src, names[i]);
        struct stat before;
        assert_int_equal(stat(f, &before), 0);
        in_dir(p, sizeof(p), "sf-link.shlm");
        unlink(p);
        assert_int_equal(symlink(f, p), 0);
        const char *outs[] = {f, p};
        for (int k = 0; k < 2; k++) {
            char *conv[] = {"convert", src, "--scheme", "f32", "-q", "-o", (char *)outs[k], NULL};
            tu_run_shardlm(r, env_rundir, conv, NULL, 10, NULL, NULL);
            expect_one_line(r, k ? "a symbolic link; an output replaces only a regular file"
                                 : "is the input");
            assert_int_equal(stat(f, &st), 0);
            assert_true(st.st_size == before.st_size && st.st_ino == before.st_ino);
        }
        unlink(p);
    }
    for (int i = 1; i < 3; i++) {
        tu_path(p, sizeof(p), "rm -rf '%s' && mkdir '%s' && cp '%s'/tokenizer*.json '%s'", tokd,
                tokd, src, tokd);
        assert_int_equal(system(p), 0);
        tu_path(f, sizeof(f), "%s/%s", tokd, names[i]);
        assert_int_equal(unlink(f), 0);
        assert_int_equal(mkfifo(f, 0600), 0);
        char *synth[] = {"synth", "--shape", "tiny-qwen3", "--tokenizer", tokd, "-o", out, NULL};
        tu_run_shardlm(r, env_rundir, synth, NULL, 10, NULL, NULL);
        tu_path(p, sizeof(p), "%s: a FIFO, not a regular file", f);
        expect_one_line(r, p);
        assert_int_equal(access(out, F_OK), -1);
    }
    /* a tokenizer.json of 300 MiB (sparse): refused by its size, for synth and for convert */
    tu_path(p, sizeof(p), "rm -rf '%s' && mkdir '%s' && cp '%s'/tokenizer*.json '%s'", tokd, tokd,
            src, tokd);
    assert_int_equal(system(p), 0);
    const char *dirs[] = {tokd, src};
    for (int i = 0; i < 2; i++) {
        tu_path(f, sizeof(f), "%s/tokenizer.json", dirs[i]);
        assert_int_equal(truncate(f, 300 << 20), 0);
    }
    char *synth[] = {"synth", "--shape", "tiny-qwen3", "--tokenizer", tokd, "-o", out, NULL};
    tu_run_shardlm(r, env_rundir, synth, NULL, 10, NULL, NULL);
    tu_path(p, sizeof(p), "%s/tokenizer.json: 314572800 bytes, more than the 268435456 expected",
            tokd);
    expect_one_line(r, p);
    assert_int_equal(access(out, F_OK), -1);
    in_dir(out, sizeof(out), "sf-out.shlm");
    char *conv[] = {"convert", src, "--scheme", "f32", "-q", "-o", out, NULL};
    tu_run_shardlm(r, env_rundir, conv, NULL, 10, NULL, NULL);
    tu_path(p, sizeof(p), "%s/tokenizer.json: 314572800 bytes, more than the 268435456 expected",
            src);
    expect_one_line(r, p);
    assert_int_equal(access(out, F_OK), -1);
    assert_int_equal(count_tmp(dir), 0);
    tu_path(p, sizeof(p), "rm -rf '%s' '%s' '%s' '%s' '%s'", hf, src, tokd, fifo, dev);
    assert_int_equal(system(p), 0);
    free(r);
}

/* A child that runs `shardlm shm purge` over and over until stop_purger. */
static pid_t start_purger(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        putenv(env_rundir);
        char *argv[] = {(char *)tu_bin(), "shm", "purge", NULL};
        for (;;) {
            pid_t c = fork();
            if (c == 0) {
                int devnull = open("/dev/null", O_WRONLY);
                dup2(devnull, 1);
                execv(argv[0], argv);
                _exit(127);
            }
            waitpid(c, NULL, 0);
        }
    }
    return pid;
}

static void stop_purger(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Waits until `shm list` calls the weights segment in use, then purges once: it must be kept. */
static void purge_while_running(pid_t pid, void *arg)
{
    char cmd[4600], out[4096];
    bool *kept = arg;
    *kept = false;
    tu_path(cmd, sizeof(cmd), "SHARDLM_RUNTIME_DIR='%s' '%s' shm list", rundir, tu_bin());
    for (int i = 0; i < 200; i++) {
        tu_cmd_output(cmd, out, sizeof(out));
        if (strstr(out, ", in use"))
            break;
        usleep(20 * 1000);
    }
    tu_path(cmd, sizeof(cmd), "SHARDLM_RUNTIME_DIR='%s' '%s' shm purge", rundir, tu_bin());
    tu_cmd_output(cmd, out, sizeof(out));
    *kept = strstr(out, "in use by a live engine (--force removes it)") != NULL;
    if (!*kept)
        fprintf(stderr, "purge said: %s\n", out);
}

static void test_purge_keeps_segments_in_use(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gold[4300];
    tu_path(gold, sizeof(gold), "%s/golden/stories260K/p1.txt", tu_data());
    char *golden = tu_slurp(gold, NULL);
    assert_non_null(golden);
    /* a running engine (slowed to 50 ms a step) keeps its segment through a purge */
    char *argv[] = {(char *)tu_bin(), "generate", "-m", model, "-p", "Once upon a time", "-n", "40",
                    "--temp",         "0",        NULL};
    char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=50", NULL};
    bool kept;
    tu_run_cmd(r, argv, env, 60, purge_while_running, &kept);
    assert_int_equal(r->status, 0);
    assert_true(kept);
    assert_int_equal(strncmp(r->out, golden, r->out_len - 1), 0);

    /* engines starting (warm, from the kept segment, or cold after a purge) while purge runs in
     * a loop: every one succeeds with the same text */
    pid_t purger = start_purger();
    for (int i = 0; i < 12; i++) {
        tu_run_cmd(r, argv, env, 60, NULL, NULL);
        if (r->status)
            fprintf(stderr, "run %d: status %d: %s\n", i, r->status, r->err);
        assert_int_equal(r->status, 0);
        assert_int_equal(strncmp(r->out, golden, r->out_len - 1), 0);
    }
    stop_purger(purger);
    /* idle now: purge removes it */
    char *purge[] = {"shm", "purge", NULL};
    run(r, purge);
    assert_int_equal(r->status, 0);
    assert_int_equal(tu_count_files(rundir), 0);
    free(golden);
    free(r);
}

static void test_foreign_names_left_alone(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char p[4400], target[4300], name[64];
    pid_t dead = tu_dead_pid();
    in_dir(target, sizeof(target), "precious.txt");
    assert_int_equal(tu_write(target, "mine", 4), 0);
    char *gen[] = {"generate", "-m", model, "-p", "hi", "-n", "2", NULL};
    run(r, gen); /* makes the runtime directory (and a weights segment) */
    assert_int_equal(r->status, 0);

    /* near-misses of our names, of a dead coordinator's pid, and our names on other file types */
    const char *plain[] = {"%d.sock.bak", "%d.kv.r0~",      "%d.exchange.old", "%d.notes",
                           "%dx.sock",    "w-link.weights", "w-0123.weights"};
    int n = 0;
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++, n++) {
        snprintf(name, sizeof(name), plain[i], (int)dead);
        tu_path(p, sizeof(p), "%s/%s", rundir, name);
        assert_int_equal(tu_write(p, "x", 1), 0);
    }
    snprintf(name, sizeof(name), "%d.exchange", (int)dead); /* ours, but a link: not ours */
    tu_path(p, sizeof(p), "%s/%s", rundir, name);
    assert_int_equal(symlink(target, p), 0);
    n++;
    tu_path(p, sizeof(p), "%s/w-0123456789abcdef-l1-r0of1-n0.weights", rundir); /* a link too */
    assert_int_equal(symlink(target, p), 0);
    n++;
    snprintf(name, sizeof(name), "%d.kv.r1", (int)dead); /* a folder of our name */
    tu_path(p, sizeof(p), "%s/%s", rundir, name);
    assert_int_equal(mkdir(p, 0700), 0);
    n++;

    char *list[] = {"shm", "list", NULL}, *purge[] = {"shm", "purge", NULL};
    run(r, list);
    assert_int_equal(r->status, 0);
    int not_ours = 0;
    for (char *s = r->out; (s = strstr(s, "not ours")); s++)
        not_ours++;
    assert_int_equal(not_ours, n);
    run(r, gen); /* its start-up cleanup of dead coordinators' files */
    assert_int_equal(r->status, 0);
    run(r, purge);
    assert_int_equal(r->status, 0);
    assert_int_equal(tu_count_files(rundir), n); /* the weights segment went, the rest stays */
    size_t len = 0;
    char *t = tu_slurp(target, &len);
    assert_true(len == 4 && memcmp(t, "mine", 4) == 0);
    free(t);
    free(r);
}

/* A persistent segment whose data changed: a warm start trusts its header (documented), `shm
 * verify` finds it, `--verify` on a start rebuilds it. */
static void test_verify_segments(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char *gen[] = {"generate", "-m", model, "-p", "Once upon a time", "-n", "20",
                   "--temp",   "0",  NULL,  NULL};
    char *verify[] = {"shm", "verify", NULL};
    run(r, gen);
    assert_int_equal(r->status, 0);
    char golden[sizeof(r->out)];
    memcpy(golden, r->out, r->out_len + 1);
    run(r, verify);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "1 weights segment checked, 0 corrupt"));

    /* change one byte of the first tensor's data in the segment */
    char cmd[4600], name[256], path[4600];
    tu_path(cmd, sizeof(cmd), "cd '%s' && find . -maxdepth 1 -type f -name 'w-*' | cut -c3-",
            rundir);
    tu_cmd_output(cmd, name, sizeof(name));
    name[strcspn(name, "\n")] = 0;
    tu_path(path, sizeof(path), "%s/%s", rundir, name);
    size_t len = 0;
    char *seg = tu_slurp(path, &len);
    assert_non_null(seg);
    struct shlm_model m;
    struct shardlm_err err;
    int prc = shlm_parse(&m, seg, len, path, &err);
    if (prc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(prc, 0);
    size_t off = m.tensors[0].offset + m.tensors[0].bytes / 2;
    char tensor[sizeof(m.tensors[0].name) + 1];
    snprintf(tensor, sizeof(tensor), "%s", m.tensors[0].name); /* seg, which m reads, is freed */
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    char flipped = (char)(seg[off] ^ 0x5a);
    assert_int_equal(pwrite(fd, &flipped, 1, (off_t)off), 1);
    close(fd);
    free(seg);

    run(r, verify);
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->out, "CORRUPT"));
    assert_non_null(strstr(r->out, tensor));
    gen[9] = "--verify";
    run(r, gen);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->err, "checksum mismatch (corrupt data); rebuilding it"));
    assert_string_equal(r->out, golden);
    run(r, verify);
    assert_int_equal(r->status, 0);
    run(r, gen); /* and a verified warm start of a good segment just starts */
    assert_int_equal(r->status, 0);
    assert_null(strstr(r->err, "rebuilding"));
    free(r);
}

/* SIGTERM at any moment of a start or a run: exit 143 soon after (a start stopped before its
 * workers connected used to wait 2 s for them, and tokenizing a long prompt 3.4 s), and a prompt
 * longer than the context fails as soon as it is tokenized, before any step. */
struct term_at {
    int ms;
    uint64_t sent_ns;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void term_later(pid_t pid, void *arg)
{
    struct term_at *t = arg;
    usleep((useconds_t)t->ms * 1000);
    t->sent_ns = now_ns();
    kill(pid, SIGTERM);
}

static void test_stops_soon(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char *argv[] = {(char *)tu_bin(),   "generate", "-m",  model,          "-p",
                    "Once upon a time", "-n",       "200", "--no-persist", NULL};
    char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=50", NULL};
    static const int at[] = {1, 10, 25, 50, 100, 200, 400};
    int files = tu_count_run_files(rundir); /* what earlier cases left on purpose */
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        struct term_at t = {at[i], 0};
        tu_run_cmd(r, argv, env, 60, term_later, &t);
        double ms = (double)(now_ns() - t.sent_ns) / 1e6;
        print_message("SIGTERM %d ms after the start: exit %d, %.0f ms later\n", at[i], r->status,
                      ms);
        assert_int_equal(r->status, 143);
        assert_true(ms < 1500); /* a bound far above the ~30 ms it takes, far below the old 2 s */
        assert_int_equal(tu_count_run_files(rundir), files);
    }
    /* a prompt of 100 KB: longer than the context, said at once */
    size_t n = 100000;
    char *prompt = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        prompt[i] = "Once upon a time "[i % 17];
    prompt[n] = 0;
    char *lng[] = {"generate", "-m", model, "-p", prompt, "--no-persist", NULL};
    run(r, lng);
    expect_refused(r, "longer than the context of 512");
    free(prompt);
    free(r);
}

/* SIGTERM stops `bench` (the model through the engine, and the kernels) with 143 = 128 +
 * SIGTERM as every command, not with SIGINT's 130, and the model bench leaves no run files. */
static void test_bench_stops_with_the_signal(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char *model_bench[] = {(char *)tu_bin(), "bench", "-m", model, "-p", "0", "-n", "100", NULL};
    char *kernels_bench[] = {(char *)tu_bin(), "bench", "kernels", NULL};
    char *const *cmds[] = {model_bench, kernels_bench};
    static const char *names[] = {"-m MODEL", "kernels"};
    char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=50", NULL}; /* 5 s of decode */
    int files = tu_count_run_files(rundir);
    for (int i = 0; i < 2; i++) {
        struct term_at t = {500, 0};
        tu_run_cmd(r, cmds[i], env, 60, term_later, &t);
        print_message("bench %s: SIGTERM after 500 ms: exit %d, %.0f ms later\n", names[i],
                      r->status, (double)(now_ns() - t.sent_ns) / 1e6);
        if (r->status != 143)
            fprintf(stderr, "stderr: %s", r->err);
        assert_int_equal(r->status, 143);
        assert_int_equal(tu_count_run_files(rundir), files);
        if (i == 0)
            assert_non_null(strstr(r->err, "shardlm bench: stopped by signal 15"));
    }
    free(r);
}

static void int_later(pid_t pid, void *arg)
{
    struct term_at *t = arg;
    usleep((useconds_t)t->ms * 1000);
    t->sent_ns = now_ns();
    kill(pid, SIGINT);
}

/* SIGINT stops `bench kernels --isa ref` within a second or so: its kernels are checked between
 * calls, and a call covers at most ~20 ms of rows (a reference GEMM took 13-37 s in one call). */
static void test_bench_kernels_ref_stops_soon(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char *argv[] = {(char *)tu_bin(), "bench", "kernels", "--isa", "ref", NULL};
    char *env[] = {env_rundir, NULL};
    static const int at[] = {1000, 2500};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        struct term_at t = {at[i], 0};
        tu_run_cmd(r, argv, env, 60, int_later, &t);
        double ms = (double)(now_ns() - t.sent_ns) / 1e6;
        print_message("bench kernels --isa ref: SIGINT after %d ms: exit %d, %.0f ms later\n",
                      at[i], r->status, ms);
        assert_int_equal(r->status, 130);
        assert_true(ms < 5000);
    }
    free(r);
}

/* `bench` without -t names the threads a worker ran, in its table and its JSON, never 0. */
static void test_bench_names_its_threads(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char *table[] = {"bench", "-m", model, "-p", "8", "-n", "4", "-r", "1", NULL, NULL};
    run(r, table);
    assert_int_equal(r->status, 0);
    const char *row = strstr(r->out, "| CPU 1w |");
    assert_non_null(row);
    int threads = atoi(row + strlen("| CPU 1w |"));
    print_message("table: %d threads\n", threads);
    assert_true(threads >= 1);
    table[9] = "--json";
    run(r, table);
    assert_int_equal(r->status, 0);
    const char *js = strstr(r->out, "\"threads\": ");
    assert_non_null(js);
    assert_int_equal(atoi(js + strlen("\"threads\": ")), threads);
    char *batch[] = {"bench", "-m", model,     "-p", "8",      "-n", "4",
                     "-r",    "1",  "--batch", "2",  "--json", NULL};
    run(r, batch);
    assert_int_equal(r->status, 0);
    js = strstr(r->out, "\"threads\": ");
    assert_non_null(js);
    assert_int_equal(atoi(js + strlen("\"threads\": ")), threads);
    free(r);
}

/* Progress in a log (stderr not a terminal) comes in whole lines, without carriage returns. */
static void test_progress_in_logs(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], out[4300];
    in_dir(gguf, sizeof(gguf), "progress.gguf");
    in_dir(out, sizeof(out), "progress.shlm");
    char *synth[] = {"synth", "--shape", "tiny", "-o", gguf, NULL};
    run(r, synth);
    assert_int_equal(r->status, 0);
    if (strchr(r->err, '\r'))
        fprintf(stderr, "synth's stderr has a carriage return: %s\n", r->err);
    assert_null(strchr(r->err, '\r'));
    assert_non_null(strstr(r->err, "shardlm synth: layer 2/2\n"));
    char *conv[] = {"convert", gguf, "--scheme", "w4a16", "--method", "gptq", "-o", out, NULL};
    run(r, conv);
    assert_int_equal(r->status, 0);
    assert_null(strchr(r->err, '\r'));
    assert_non_null(strstr(r->err, "shardlm convert: wrote "));
    unlink(gguf);
    unlink(out);
    free(r);
}

/* Whether the tmpfs at @mnt could be mounted with @opts (else why, and that the checks @what are
 * skipped, is said: the caller skips them with cmocka's skip(), as test_load and test_seg do). */
static bool mount_tmpfs(const char *mnt, const char *opts, const char *what)
{
    mkdir(mnt, 0700);
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0)
        return true;
    print_message("cannot mount a tmpfs (%s) with %s; run as root with mount permission "
                  "(CAP_SYS_ADMIN) to check %s: skipped\n",
                  strerror(errno), opts, what);
    return false;
}

/* Whether convert's stderr @err says it is calibrating. */
static bool calibrating(const char *err) { return strstr(err, ", calibrating on ") != NULL; }

/* Whether convert's stderr @err says the calibration's statistics are done (its last stage line
 * "calibration statistics N/N"): --method auto has begun its held-out runs. */
static bool statistics_done(const char *err)
{
    const char *at = NULL, *p = err;
    while ((p = strstr(p, "calibration statistics ")))
        at = p++;
    long done, total;
    return at && sscanf(at, "calibration statistics %ld/%ld", &done, &total) == 2 && done == total;
}

/* Runs @argv (convert, a long calibration) with stderr into @err_path; once @ready says so of
 * its stderr and its temporary file @out.tmp.<pid> exists (both within 60 s, else the test
 * fails), sends it @sig. Returns its exit status (128 + signal if killed by one), the ms from
 * the signal to its end in *@ms and its stderr (malloc'd) in *@err; its temporary file's name
 * goes into @tmp. */
static int signal_convert(char *const argv[], const char *err_path, const char *out,
                          bool (*ready)(const char *err), int sig, char *tmp, size_t tmp_len,
                          double *ms, char **err)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        putenv(env_rundir);
        int o = open("/dev/null", O_WRONLY), e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(o, 1);
        dup2(e, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    tu_path(tmp, tmp_len, "%s.tmp.%d", out, (int)pid);
    bool is_ready = false, exists = false, ended = false;
    int st = 0;
    for (int i = 0; i < 6000 && !(is_ready && exists) && !ended; i++) {
        usleep(10 * 1000);
        exists = access(tmp, F_OK) == 0; /* before the exit check: an exit removes it */
        char *e = tu_slurp(err_path, NULL);
        is_ready = e && ready(e);
        free(e);
        ended = waitpid(pid, &st, WNOHANG) == pid;
    }
    if (!(is_ready && exists) || ended) {
        if (!ended) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
        char *e = tu_slurp(err_path, NULL);
        fprintf(stderr,
                "convert %s before it was signalled (calibrating said: %d, %s: %d); "
                "stderr: %s\n",
                ended ? "ended" : "not ready within 60 s", is_ready, tmp, exists, e ? e : "(none)");
        free(e);
        fail_msg("convert was not signalled while calibrating");
    }
    uint64_t sent = now_ns();
    kill(pid, sig);
    for (int i = 0; i < 6000 && !ended; i++) {
        ended = waitpid(pid, &st, WNOHANG) == pid;
        if (!ended)
            usleep(10 * 1000);
    }
    *ms = (double)(now_ns() - sent) / 1e6;
    if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    *err = tu_slurp(err_path, NULL);
    assert_non_null(*err);
    return !ended ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* convert's temporary file OUT.tmp.<pid> never outlives it: SIGINT or SIGTERM during the
 * calibration (once it said so and the file is there) stops it with 130 or 143 and removes it;
 * ENOSPC removes it and names OUT (as root: it needs two small tmpfs mounts, else skipped, said
 * after the rest ran); one that a killed convert left is removed by the next convert to OUT,
 * which says so. */
static void test_convert_leaves_no_temporary(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char gguf[4300], out[4300], p[4400], mnt[4300], err_path[4300], tmp[4400];
    in_dir(gguf, sizeof(gguf), "interrupted.gguf");
    in_dir(out, sizeof(out), "interrupted.shlm");
    /* synth dies of a signal: the next synth to the same file removes what it left */
    char synth_stale[4400];
    tu_path(synth_stale, sizeof(synth_stale), "%s.tmp.%d", gguf, (int)tu_dead_pid());
    assert_int_equal(tu_write(synth_stale, "partial", 7), 0);
    char *synth[] = {"synth", "--shape", "tiny", "-o", gguf, NULL};
    run(r, synth);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->err, "removed 1 temporary file of "));
    assert_int_equal(access(synth_stale, F_OK), -1);
    /* a calibration of 1M tokens: minutes, stopped once it runs */
    char *argv[] = {(char *)tu_bin(), "convert",        gguf,      "--scheme", "w4a16", "--method",
                    "gptq",           "--calib-tokens", "1048576", "-o",       out,     NULL};
    in_dir(err_path, sizeof(err_path), "interrupted.err");
    for (int i = 0; i < 2; i++) {
        double ms = 0;
        char *err = NULL;
        int st = signal_convert(argv, err_path, out, calibrating, i ? SIGTERM : SIGINT, tmp,
                                sizeof(tmp), &ms, &err);
        print_message("convert: %s once calibrating with %s there: exit %d, %.0f ms later\n",
                      i ? "SIGTERM" : "SIGINT", tmp, st, ms);
        if (st != (i ? 143 : 130))
            fprintf(stderr, "stderr: %s", err);
        assert_int_equal(st, i ? 143 : 130);
        assert_non_null(strstr(err, i ? "stopped by signal 15" : "stopped by signal 2"));
        assert_true(ms < 5000);
        assert_int_equal(access(tmp, F_OK), -1);
        assert_int_equal(count_tmp(dir), 0);
        assert_int_equal(access(out, F_OK), -1);
        free(err);
    }
    /* --method auto, once its held-out runs have begun (16384 held-out tokens: about 1.7 s a
     * run here): SIGINT stops it within a forward step, leaving nothing (it ran the f32
     * reference's held-out forward to its end first: 1.2 s) */
    char txt[4300];
    in_dir(txt, sizeof(txt), "calib.txt");
    tu_path(p, sizeof(p), "for i in $(seq 100); do cat '%s/calib/stories.txt'; done > '%s'",
            tu_data(), txt);
    assert_int_equal(system(p), 0);
    char *autov[] = {(char *)tu_bin(), "convert", gguf,      "--scheme", "w4a16",
                     "--method",       "auto",    "--calib", txt,        "--calib-tokens",
                     "131072",         "-o",      out,       NULL};
    double ms = 0;
    char *err = NULL;
    int st =
        signal_convert(autov, err_path, out, statistics_done, SIGINT, tmp, sizeof(tmp), &ms, &err);
    print_message("convert --method auto: SIGINT once its held-out runs began: exit %d, %.0f ms "
                  "later\n",
                  st, ms);
    if (st != 130 || ms >= 1000)
        fprintf(stderr, "stderr: %s", err);
    assert_int_equal(st, 130);
    assert_non_null(strstr(err, "stopped by signal 2"));
    assert_true(ms < 1000);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(count_tmp(dir), 0);
    assert_int_equal(access(out, F_OK), -1);
    free(err);
    unlink(txt);
    unlink(err_path);

    /* what a killed convert left (a dead pid's) goes at the next convert; a live one's stays */
    pid_t dead = tu_dead_pid();
    char stale[4400], live[4400];
    tu_path(stale, sizeof(stale), "%s.tmp.%d", out, (int)dead);
    tu_path(live, sizeof(live), "%s.tmp.%d", out, (int)getpid());
    assert_int_equal(tu_write(stale, "partial", 7), 0);
    assert_int_equal(tu_write(live, "running", 7), 0);
    char *conv[] = {"convert", gguf, "--scheme", "f32", "-o", out, NULL};
    run(r, conv);
    assert_int_equal(r->status, 0);
    tu_path(p, sizeof(p), "removed 1 temporary file of %s left by a stopped convert", out);
    if (!strstr(r->err, p))
        fprintf(stderr, "stderr: %s", r->err);
    assert_non_null(strstr(r->err, p));
    assert_int_equal(access(stale, F_OK), -1);
    assert_int_equal(access(live, F_OK), 0);
    unlink(live);
    unlink(out);

    /* ENOSPC: while writing (a 200 KiB tmpfs for files of 261 and 532 KB), and creating (no inode
     * left):
     * the message names OUT, not its temporary file, and nothing is left */
    in_dir(mnt, sizeof(mnt), "full");
    const char *opts[] = {"size=200k,mode=0700", "size=1m,nr_inodes=1,mode=0700"};
    const char *needle[] = {"write failed: No space left on device",
                            "cannot create its temporary file beside it: No space left"};
    for (int i = 0; i < 2; i++) {
        if (!mount_tmpfs(mnt, opts[i], "convert's and synth's ENOSPC")) {
            unlink(gguf);
            free(r);
            skip(); /* everything else of this case has run */
        }
        char full_out[4400], full_gguf[4400];
        tu_path(full_out, sizeof(full_out), "%s/out.shlm", mnt);
        tu_path(full_gguf, sizeof(full_gguf), "%s/out.gguf", mnt);
        char *c2[] = {"convert", gguf, "--scheme", "f32", "-q", "-o", full_out, NULL};
        char *s2[] = {"synth", "--shape", "tiny", "-o", full_gguf, NULL};
        char *const *cmds[] = {c2, s2};
        for (int c = 0; c < 2; c++) {
            run(r, cmds[c]);
            tu_path(p, sizeof(p), "%s: %s", cmds[c] == c2 ? full_out : full_gguf, needle[i]);
            if (c == 1 && i == 0) /* synth's writer names the call that failed */
                tu_path(p, sizeof(p), "%s: ", full_gguf);
            if (!strstr(r->err, p) || strstr(r->err, ".tmp."))
                fprintf(stderr, "stderr: %s(wanted '%s')\n", r->err, p);
            assert_int_equal(r->status, 1);
            assert_non_null(strstr(r->err, p));
            assert_null(strstr(r->err, ".tmp."));
            assert_int_equal(tu_count_files(mnt), 0);
        }
        assert_int_equal(umount2(mnt, MNT_DETACH), 0);
    }
    unlink(gguf);
    free(r);
}

/* Runs shardlm with @args (NULL-terminated, after the program name), stderr into @err_path and
 * stdout to /dev/null, extra environment entry @env (or NULL); returns the exit status and the
 * coordinator's own peak RSS (wait4: the workers are other processes) in KiB into *@kb. */
static int run_rss(char *const args[], const char *env, const char *err_path, long *kb)
{
    char *argv[40] = {(char *)tu_bin()};
    int n = 1;
    for (int i = 0; args[i] && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        putenv(env_rundir);
        if (env)
            putenv((char *)env);
        int out = open("/dev/null", O_WRONLY),
            err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(out, 1);
        dup2(err, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    struct rusage ru;
    assert_int_equal(wait4(pid, &st, 0, &ru), pid);
    *kb = ru.ru_maxrss;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The coordinator's peak RSS bound for those runs: 64 MiB, and 512 MiB under ASan (its shadow
 * memory and quarantine), which still tells the 1.58 GB of the bookkeeping it replaced. */
#if defined(__SANITIZE_ADDRESS__) || defined(__has_feature)
#if defined(__SANITIZE_ADDRESS__)
#define RSS_BOUND_KB (512 * 1024)
#elif __has_feature(address_sanitizer)
#define RSS_BOUND_KB (512 * 1024)
#endif
#endif
#ifndef RSS_BOUND_KB
#define RSS_BOUND_KB (64 * 1024)
#endif

/* A KV cache asked past what the memory holds, or without a prefix cache past what the model
 * can use (--max-seqs contexts), is capped, said in one line; the coordinator's bookkeeping
 * stays that of the blocks it keeps (2^27 blocks asked for a 512-token context cost it
 * 1.58 GB, 2^30 failed "out of memory"). */
static void test_kv_cache_capped(void **state)
{
    char err_path[4300], mnt[4300], env[4400];
    in_dir(err_path, sizeof(err_path), "kv.err");
    struct {
        const char *opt, *val, *cache, *said;
    } cases[] = {
        {"--kv-tokens", "2147483648", "--no-prefix-cache",
         "--kv-tokens 2147483648: capped at 512 positions (32 blocks)"},
        {"--kv-tokens", "17179869184", "--no-prefix-cache",
         "--kv-tokens 17179869184: capped at 512 positions (32 blocks)"},
        {"--kv-mem", "1000G", "--no-prefix-cache",
         "capped at 512 positions (32 blocks): 1 sequence (--max-seqs) of a "
         "context of 512 is all the model can use without a prefix cache"},
        /* with the prefix cache, blocks past the contexts keep prefixes: the memory caps */
        {"--kv-tokens", "17179869184", "--verbose", "(MemAvailable) holds no more"},
        {"--kv-mem", "1000G", "--verbose", "(MemAvailable) holds no more"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *args[] = {"generate",
                        "-m",
                        model,
                        "-p",
                        "Once upon a time",
                        "-n",
                        "4",
                        "--no-persist",
                        (char *)cases[i].opt,
                        (char *)cases[i].val,
                        (char *)cases[i].cache,
                        NULL};
        long kb = 0;
        int st = run_rss(args, NULL, err_path, &kb);
        char *err = tu_slurp(err_path, NULL);
        assert_non_null(err);
        print_message("generate %s %s: exit %d, coordinator peak RSS %ld KiB\n", cases[i].opt,
                      cases[i].val, st, kb);
        if (st || !strstr(err, cases[i].said))
            fprintf(stderr, "stderr: %s(wanted '%s')\n", err, cases[i].said);
        assert_int_equal(st, 0);
        assert_non_null(strstr(err, cases[i].said));
        assert_true(kb < RSS_BOUND_KB);
        free(err);
    }
    /* within what the model can use, past what the runtime directory (an 8 MiB tmpfs) holds */
    in_dir(mnt, sizeof(mnt), "kvroom");
    if (!mount_tmpfs(mnt, "size=8m,mode=0700", "a KV cache past an 8 MiB runtime directory"))
        skip(); /* everything else of this case has run */
    tu_path(env, sizeof(env), "SHARDLM_RUNTIME_DIR=%s", mnt);
    char *args[] = {"generate", "-m", model,        "-p", "Once upon a time",
                    "-n",       "4",  "--max-seqs", "16", "--kv-tokens",
                    "8192",     NULL};
    long kb = 0;
    int st = run_rss(args, env, err_path, &kb);
    char *err = tu_slurp(err_path, NULL);
    assert_non_null(err);
    const char *said = "holds no more";
    if (st || !strstr(err, "--kv-tokens 8192: capped at ") || !strstr(err, said))
        fprintf(stderr, "stderr: %s", err);
    assert_int_equal(st, 0);
    assert_non_null(strstr(err, "--kv-tokens 8192: capped at "));
    assert_non_null(strstr(err, "the room left in the runtime directory holds no more"));
    free(err);
    char *purge[] = {(char *)tu_bin(), "shm", "purge", NULL}, *penv[] = {env, NULL};
    struct tu_run *r = malloc(sizeof(*r));
    tu_run_cmd(r, purge, penv, 60, NULL, NULL);
    free(r);
    assert_int_equal(umount2(mnt, MNT_DETACH), 0);
}

/* The tokenizer stored in a .shlm is checked: one changed byte is an error, not other text. */
static void test_stored_tokenizer_checked(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char bad[4300];
    in_dir(bad, sizeof(bad), "tok-flipped.shlm");
    size_t len = 0;
    char *m = tu_slurp(model, &len);
    assert_non_null(m);
    struct shlm_model img;
    struct shardlm_err err;
    assert_int_equal(shlm_parse(&img, m, len, model, &err), 0);
    assert_true(img.hdr->tok_checksum != 0);
    m[img.hdr->tok_offset + img.hdr->tok_bytes / 2] ^= 0x20;
    assert_int_equal(tu_write(bad, m, len), 0);
    char *tok[] = {"tokenize", "--tokenizer", bad, "Once upon a time", NULL};
    run(r, tok);
    expect_refused(r, "the stored tokenizer does not match its checksum");
    char *gen[] = {"generate", "-m", bad, "-p", "hi", "-n", "2", "--no-persist", NULL};
    run(r, gen);
    expect_refused(r, "the stored tokenizer does not match its checksum");
    tok[2] = model; /* the intact file */
    run(r, tok);
    assert_int_equal(r->status, 0);
    free(m);
    free(r);
}

/* A failed start leaves nothing: checks come before anything is created, and a runtime directory
 * this start made goes again. */
static void test_failed_start_leaves_nothing(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char fresh[4300], env[4400], longdir[2048], env_long[2200];
    in_dir(fresh, sizeof(fresh), "fresh-run");
    tu_path(env, sizeof(env), "SHARDLM_RUNTIME_DIR=%s", fresh);
    char *gen[] = {(char *)tu_bin(), "generate", "-m", model, "-p", "hi", "-n", "2", NULL};
    char *missing[] = {(char *)tu_bin(), "generate", "-m", "/nonexistent/m.shlm", "-p", "hi", NULL};
    /* a model that cannot be opened, and segments that cannot be allocated */
    char *e1[] = {env, NULL}, *e2[] = {env, "SHARDLM_SHM_LIMIT=1000", NULL};
    tu_run_cmd(r, missing, e1, 60, NULL, NULL);
    expect_refused(r, "No such file");
    assert_int_equal(access(fresh, F_OK), -1);
    tu_run_cmd(r, gen, e2, 60, NULL, NULL);
    expect_refused(r, "No space left on device");
    assert_int_equal(access(fresh, F_OK), -1);
    /* a runtime directory too long for the workers' socket: refused before a segment is built */
    int n = snprintf(longdir, sizeof(longdir), "%s/", dir);
    while (n < 120)
        longdir[n++] = 'd';
    longdir[n] = 0;
    tu_path(env_long, sizeof(env_long), "SHARDLM_RUNTIME_DIR=%s", longdir);
    char *e3[] = {env_long, NULL};
    tu_run_cmd(r, gen, e3, 60, NULL, NULL);
    expect_refused(r, "too long a path for the workers' socket");
    assert_int_equal(access(longdir, F_OK), -1);
    /* and with --listen tcp it does not matter */
    char *tcp[] = {(char *)tu_bin(), "generate", "-m",           model, "-p", "hi", "-n", "2",
                   "--listen",       "tcp",      "--no-persist", NULL};
    tu_run_cmd(r, tcp, e3, 60, NULL, NULL);
    assert_int_equal(r->status, 0);
    tu_rmdir(longdir);
    free(r);
}

/* Messages: each names the option, file or variable and what was expected; usage errors exit 2. */
static void test_messages(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    char text[4300], shlm_bad[4300], out[4300], p[8800];
    in_dir(text, sizeof(text), "text.gguf");
    assert_int_equal(tu_write(text, "plain text, not a model\n", 24), 0);
    in_dir(shlm_bad, sizeof(shlm_bad), "bad-magic.shlm");
    tu_path(p, sizeof(p), "cp '%s' '%s' && printf XXXX | dd of='%s' conv=notrunc 2>/dev/null",
            model, shlm_bad, shlm_bad);
    assert_int_equal(system(p), 0);
    in_dir(out, sizeof(out), "never.shlm");
    struct {
        int status;
        const char *needle;
        char *args[12];
    } cases[] = {
        {2, "unexpected argument 'extra'", {"generate", "-m", model, "-p", "hi", "extra", "words"}},
        {2, "unexpected argument 'x'", {"eval", "-m", model, "--ref", dir, "x"}},
        {2, "unexpected argument 'x'", {"load", "-m", model, "x"}},
        {2, "unexpected argument 'x'", {"keygen", "-o", out, "x"}},
        {2,
         "--workers '0': expected a count 1..256",
         {"generate", "-m", model, "-p", "hi", "--workers", "0"}},
        {2, "--restarts '-1': expected a count 0..100", {"load", "-m", model, "--restarts", "-1"}},
        {2,
         "-n '99999999999999999999': expected a count 0..16777216",
         {"generate", "-m", model, "-p", "hi", "-n", "99999999999999999999"}},
        {1, "names a CPU twice", {"generate", "-m", model, "-p", "hi", "--cpus", "0,0"}},
        {1,
         "not a GGUF file, a .shlm file, a Hugging Face folder or a llama2.c checkpoint",
         {"convert", text, "--scheme", "f32", "-o", out}},
        {1,
         "not a GGUF file, a .shlm file, a Hugging Face folder or a llama2.c checkpoint",
         {"convert", shlm_bad, "--scheme", "f32", "-o", out}},
        {1,
         "not a GGUF file, a .shlm file, a Hugging Face folder or a llama2.c checkpoint",
         {"inspect", text}},
        {1, "a .shlm file, converted already", {"convert", model, "--scheme", "f32", "-o", out}},
        {2,
         "--decode: 'x' is not a token id",
         {"tokenize", "--tokenizer", model, "--decode", "1", "x"}},
        {2, "unknown kernel table 'nope'", {"bench", "kernels", "--isa", "nope"}},
        /* a misspelt bench subcommand is not the model bench missing -m */
        {2, "unknown bench subcommand 'bogus'", {"bench", "bogus"}},
        {2, "--threads '0': expected 1..1024", {"bench", "quant", "-t", "0"}},
        {2, "unexpected argument 'x'", {"bench", "quant", "x"}},
        {1, "exists and is not a directory", {"keygen", "-o", model}},
        /* an empty path is refused wherever a path is taken (eval --ref "" read /greedy.tsv) */
        {2, "--ref '': expected a path", {"eval", "-m", model, "--ref", ""}},
        {2, "--save '': expected a path", {"eval", "-m", model, "--ref", dir, "--save", ""}},
        {2, "-m '': expected a model file's path", {"generate", "-m", "", "-p", "hi"}},
        {2, "--keys '': expected a folder's path", {"load", "-m", model, "--keys", ""}},
        {2, "-f '': expected a path", {"generate", "-m", model, "-f", ""}},
        {2, "-m '': expected a path", {"bench", "-m", ""}},
        {2, "--tokenizer '': expected a path", {"tokenize", "--tokenizer", "", "hi"}},
        {2, "--tokenizer '': expected a path", {"bench", "tokenizer", "--tokenizer", ""}},
        {2, "-o '': expected a path", {"keygen", "-o", ""}},
        {2, "-o '': expected a path", {"synth", "--shape", "tiny", "-o", ""}},
        {2, "FILE '': expected a path", {"inspect", ""}},
        {2, "--chat-template '': expected a path", {"template", "--chat-template", ""}},
        {2, "INPUT '': expected a path", {"convert", "", "--scheme", "f32", "-o", out}},
        {2,
         "--calib '': expected a path",
         {"convert", model, "--scheme", "w4a16", "--calib", "", "-o", out}},
        {2, "-o '': expected a path", {"convert", model, "--priority", "speed", "-o", ""}},
        {2, "--api-key-file '': expected a path", {"serve", "-m", model, "--api-key-file", ""}},
        {2, "--chat-template '': expected a path", {"serve", "-m", model, "--chat-template", ""}},
        /* the int4 schemes' options with another scheme: refused, never ignored */
        {2,
         "--head-bits applies to w4a16 and w4a8 only",
         {"convert", model, "--scheme", "f32", "--head-bits", "4", "-o", out}},
        {2,
         "--head-bits '5': expected 8, 6 or 4",
         {"convert", model, "--scheme", "w4a8", "--head-bits", "5", "-o", out}},
        {2,
         "--head-bits applies to w4a16 and w4a8 only",
         {"convert", model, "--scheme", "bf16", "--head-bits", "8", "-o", out}},
        {1,
         "shardlm convert: --method gptq: f32 has no int4 matrices to round",
         {"convert", model, "--scheme", "f32", "--method", "gptq", "-o", out}},
        {1,
         "shardlm convert: --calib self: bf16 uses no calibration",
         {"convert", model, "--scheme", "bf16", "--calib", "self", "-o", out}},
        {2,
         "--priority chooses a scheme when --scheme is not given",
         {"convert", model, "--scheme", "w4a16", "--priority", "fidelity", "-o", out}},
        /* numbers: plain decimals within the documented range, as every option takes them */
        {2,
         "--mb '1e3': expected 0.001..512",
         {"bench", "tokenizer", "--tokenizer", model, "--mb", "1e3"}},
        {2,
         "--mb '1000': expected 0.001..512",
         {"bench", "tokenizer", "--tokenizer", model, "--mb", "1000"}},
        {2,
         "--temp '1e0': expected 0..100",
         {"generate", "-m", model, "-p", "hi", "--temp", "1e0"}},
        {2,
         "--damp '1e-2': expected a number above 0",
         {"convert", model, "--scheme", "w4a16", "--method", "gptq", "--damp", "1e-2", "-o", out}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run(r, cases[i].args);
        if (r->status != cases[i].status)
            fprintf(stderr, "case %zu: status %d, want %d: %s", i, r->status, cases[i].status,
                    r->err);
        assert_int_equal(r->status, cases[i].status);
        expect_refused(r, cases[i].needle);
    }
    /* a method refused for the scheme is not announced first as calibrating */
    char *f32_gptq[] = {"convert", model, "--scheme", "f32", "--method", "gptq", "-o", out, NULL};
    run(r, f32_gptq);
    assert_int_equal(r->status, 1);
    assert_null(strstr(r->err, "calibrating"));
    /* the environment: set wrong is an error, not the default */
    char *gen[] = {(char *)tu_bin(), "generate", "-m", model, "-p", "hi", "-n", "2", NULL};
    char *empty[] = {"SHARDLM_RUNTIME_DIR=", NULL};
    tu_run_cmd(r, gen, empty, 60, NULL, NULL);
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "SHARDLM_RUNTIME_DIR is set but empty"));
    char *limit[] = {env_rundir, "SHARDLM_SHM_LIMIT=12x", NULL};
    tu_run_cmd(r, gen, limit, 60, NULL, NULL);
    assert_int_equal(r->status, 2);
    assert_non_null(strstr(r->err, "SHARDLM_SHM_LIMIT='12x': expected a byte count"));
    /* a failed write to stdout says so */
    tu_path(p, sizeof(p),
            "SHARDLM_RUNTIME_DIR='%s' '%s' generate -m '%s' -p hi -n 2 --no-persist"
            " >/dev/full 2>'%s/full.err'",
            rundir, tu_bin(), model, dir);
    assert_int_not_equal(system(p), 0);
    tu_path(p, sizeof(p), "%s/full.err", dir);
    char *err = tu_slurp(p, NULL);
    assert_non_null(err);
    if (!strstr(err, "stdout: No space left on device"))
        fprintf(stderr, "stderr: %s", err);
    assert_non_null(strstr(err, "stdout: No space left on device"));
    free(err);
    free(r);
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outputs_replace_only_regular_files),
        cmocka_unit_test(test_eval_save_and_reference),
        cmocka_unit_test(test_eval_non_finite),
        cmocka_unit_test(test_eval_rel_l2),
        cmocka_unit_test(test_fifo_arguments),
        cmocka_unit_test(test_synth_folders),
        cmocka_unit_test(test_purge_keeps_segments_in_use),
        cmocka_unit_test(test_verify_segments),
        cmocka_unit_test(test_foreign_names_left_alone),
        cmocka_unit_test(test_stops_soon),
        cmocka_unit_test(test_bench_stops_with_the_signal),
        cmocka_unit_test(test_bench_kernels_ref_stops_soon),
        cmocka_unit_test(test_bench_names_its_threads),
        cmocka_unit_test(test_progress_in_logs),
        cmocka_unit_test(test_convert_leaves_no_temporary),
        cmocka_unit_test(test_kv_cache_capped),
        cmocka_unit_test(test_stored_tokenizer_checked),
        cmocka_unit_test(test_failed_start_leaves_nothing),
        cmocka_unit_test(test_messages),
    };
    /* TEST_FILTER=test_name (cmocka's pattern) runs only those cases, as one works on them */
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
