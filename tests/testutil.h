/* SPDX-License-Identifier: MIT */
/* Test helpers: paths to the test data and the built binaries, temporary folders, running a
 * command with a timeout and capturing its output. Header-only so each test stays one file. */
#ifndef SHARDLM_TESTUTIL_H
#define SHARDLM_TESTUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A fixed-seed PRNG for test data: xorshift64*, Box-Muller normals (one state per test binary). */
static inline uint64_t *tu_rng_state(void)
{
    static uint64_t s = 0x9e3779b97f4a7c15ull;
    return &s;
}
static inline void rng_seed(uint64_t s) { *tu_rng_state() = s ? s : 0x9e3779b97f4a7c15ull; }
static inline uint64_t rng_u64(void)
{
    uint64_t *s = tu_rng_state();
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}
/* uniform in (0, 1) */
static inline double rng_unit(void)
{
    return ((double)(rng_u64() >> 11) + 0.5) / 9007199254740992.0;
}
static inline float rng_normal(void)
{
    double u = rng_unit(), v = rng_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}

static inline const char *tu_env(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}
/* The test data (golden outputs, tokenizers, chat templates: tests/data, see its README.md):
 * SHARDLM_TEST_DATA from the environment, else the CMake cache variable SHARDLM_TEST_DATA, which
 * ctest passes as SHARDLM_TEST_DATA_DEFAULT; the source tree; the shardlm binary */
/* A loopback TCP port no socket holds right now (the kernel's pick for port 0), or -1. */
static inline int tu_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static inline const char *tu_data(void)
{
    return tu_env("SHARDLM_TEST_DATA", tu_env("SHARDLM_TEST_DATA_DEFAULT", "tests/data"));
}
static inline const char *tu_src(void) { return tu_env("SHARDLM_SRC", "."); }
static inline const char *tu_bin(void) { return tu_env("SHARDLM_BIN", "shardlm"); }

/* The shardlm-worker beside tu_bin() into @out. */
static inline void tu_worker(char *out, size_t len)
{
    char bin[4096];
    snprintf(bin, sizeof(bin), "%s", tu_bin());
    snprintf(out, len, "%s/shardlm-worker", dirname(bin));
}

/* Whether the test data is there. It is part of the repository, so a missing folder is a broken
 * checkout or a wrong SHARDLM_TEST_DATA, and the test fails saying so: never a reason to skip. */
static inline bool tu_have_data(void)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/golden/stories260K/greedy.tsv", tu_data());
    if (access(p, R_OK) == 0)
        return true;
    fprintf(stderr,
            "FAIL: no test data at %s (%s): it is the repository's tests/data; restore it, "
            "or point SHARDLM_TEST_DATA (or -DSHARDLM_TEST_DATA=DIR) at a copy\n",
            tu_data(), strerror(errno));
    return false;
}

/* Skips the running cmocka test for want of hardware: @flags are the /proc/cpuinfo flags it needs,
 * comma-separated, the rest says what is missing. This line is what tests/check_skips.sh (run by
 * .ci/run) looks for: any other skip, or one whose flags this CPU all has, fails CI. */
#define tu_skip_hardware(flags, ...)                                                               \
    do {                                                                                           \
        print_message("[  SKIP    ] hardware %s: ", flags);                                        \
        print_message(__VA_ARGS__);                                                                \
        print_message("; it runs on a CPU with these flags\n");                                    \
        skip();                                                                                    \
    } while (0)

static inline void tu_path(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, len, fmt, ap);
    va_end(ap);
}

/* A fresh private folder under $TMPDIR; removed (with its files, one level) by tu_rmdir. */
static inline void tu_mkdtemp(char *out, size_t len, const char *tag)
{
    snprintf(out, len, "%s/shardlm-%s-XXXXXX", tu_env("TMPDIR", "/tmp"), tag);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        abort();
    }
}

static inline void tu_rmdir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Runs the shell command @cmd and returns what it wrote to stdout (NUL-terminated, at most
 * @len - 1 bytes) in @out; "" if it cannot run. */
static inline void tu_cmd_output(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = 0;
    if (p)
        pclose(p);
}

/* Entries in @dir, not counting . and .. nor names that match the grep pattern @skip (NULL:
 * none); -1 if it cannot be read. */
static inline int tu_count_entries(const char *dir, const char *skip)
{
    char cmd[4400], out[32];
    snprintf(cmd, sizeof(cmd), "cd '%s' 2>/dev/null && ls -A | grep -vc '%s'", dir,
             skip ? skip : "^$");
    tu_cmd_output(cmd, out, sizeof(out));
    return out[0] ? atoi(out) : -1;
}

/* Number of entries in @dir, not counting . and .. (-1 if it cannot be read). */
static inline int tu_count_files(const char *dir) { return tu_count_entries(dir, NULL); }

/* Entries in @dir other than persistent weights segments ("w-*", which outlive runs by design):
 * the run files a finished run must not leave (-1 if it cannot be read). */
static inline int tu_count_run_files(const char *dir) { return tu_count_entries(dir, "^w-"); }

struct tu_run {
    int status; /* exit code, or 128 + signal, or -1 on timeout */
    char out[1 << 16], err[1 << 14];
    size_t out_len, err_len;
};

/* Runs argv (NULL-terminated) with extra environment entries @env ("K=V", NULL-terminated or
 * NULL), capturing stdout and stderr, killing it after @timeout_s. If @on_start is not NULL it
 * is called with the child's pid once it runs (to signal it, say). */
static inline void tu_run_cmd(struct tu_run *r, char *const argv[], char *const env[],
                              int timeout_s, void (*on_start)(pid_t, void *), void *arg)
{
    int po[2], pe[2];
    memset(r, 0, sizeof(*r));
    if (pipe(po) || pipe(pe))
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(pe[0]);
        for (int i = 0; env && env[i]; i++)
            putenv(env[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    if (on_start)
        on_start(pid, arg);
    struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    time_t end = time(NULL) + timeout_s;
    int open_fds = 2;
    while (open_fds > 0) {
        int left = (int)(end - time(NULL));
        if (left <= 0)
            break;
        if (poll(fds, 2, left * 1000) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (!(fds[i].revents & (POLLIN | POLLHUP)))
                continue;
            char *buf = i ? r->err : r->out;
            size_t *len = i ? &r->err_len : &r->out_len;
            size_t cap = (i ? sizeof(r->err) : sizeof(r->out)) - 1;
            char tmp[4096];
            ssize_t n = read(fds[i].fd, tmp, sizeof(tmp));
            if (n <= 0) {
                fds[i].fd = -1;
                open_fds--;
                continue;
            }
            size_t take = (size_t)n < cap - *len ? (size_t)n : cap - *len;
            memcpy(buf + *len, tmp, take);
            *len += take;
            buf[*len] = 0;
        }
    }
    int st;
    if (open_fds > 0) { /* timed out */
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        r->status = -1;
    } else {
        waitpid(pid, &st, 0);
        r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    close(po[0]);
    close(pe[0]);
}

/* A pid that no process has: a child that exited and was reaped. */
static inline pid_t tu_dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid < 0 || waitpid(pid, NULL, 0) != pid)
        abort();
    return pid;
}

/* Reads a whole small file into a malloc'd NUL-terminated buffer (NULL if it cannot). */
static inline char *tu_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b)
        b[n] = 0;
    if (len)
        *len = (size_t)n;
    fclose(f);
    return b;
}

static inline int tu_write(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(buf, 1, len, f);
    fclose(f);
    return w == len ? 0 : -1;
}

/* Runs the shardlm binary with @args (NULL-terminated, without the program name), the
 * environment entry @env_rundir ("SHARDLM_RUNTIME_DIR=...") and the extra entries @extra_env
 * (NULL-terminated or NULL). See tu_run_cmd for @on_start. */
static inline void tu_run_shardlm(struct tu_run *r, char *env_rundir, char *const args[],
                                  char *const extra_env[], int timeout_s,
                                  void (*on_start)(pid_t, void *), void *arg)
{
    char *argv[40] = {(char *)tu_bin()};
    int n = 1;
    for (int i = 0; args[i] && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *env[8] = {env_rundir};
    int ne = 1;
    for (int i = 0; extra_env && extra_env[i] && ne < 7; i++)
        env[ne++] = extra_env[i];
    env[ne] = NULL;
    tu_run_cmd(r, argv, env, timeout_s, on_start, arg);
}

/* Whether a shardlm-worker whose endpoint lies in @rundir still runs. */
static inline bool tu_workers_alive(const char *rundir)
{
    char cmd[4300];
    /* [s]: the pattern must not match the shell that runs pgrep */
    snprintf(cmd, sizeof(cmd), "pgrep -f '[s]hardlm-worker --endpoint ipc://%s/' >/dev/null",
             rundir);
    return system(cmd) == 0;
}

/* Line @no (from 1) of @data/golden/stories260K/greedy.tsv: the prompt into @prompt and the
 * number of its token ids (BOS included) into *@n_ids. Returns 0, or -1 if there is no such
 * line. */
static inline int tu_golden_prompt(const char *data, int no, char *prompt, size_t len, int *n_ids)
{
    char path[4200];
    *n_ids = 0;
    snprintf(path, sizeof(path), "%s/golden/stories260K/greedy.tsv", data);
    char *tsv = tu_slurp(path, NULL), *line = tsv;
    for (int i = 1; line && i < no; i++)
        line = (line = strchr(line, '\n')) ? line + 1 : NULL;
    char *tab = line ? strchr(line, '\t') : NULL, *end = tab ? strchr(tab + 1, '\t') : NULL;
    if (!end) {
        free(tsv);
        return -1;
    }
    snprintf(prompt, len, "%.*s", (int)(tab - line), line);
    for (char *p = tab + 1; p < end; p++)
        *n_ids += (p == tab + 1 || p[-1] == ' ') && *p != ' ';
    free(tsv);
    return 0;
}

/* The golden continuation of stories260K prompt @no under @data: its text after @prompt, without
 * the final newline, malloc'd; NULL when the file is missing or does not start with @prompt. */
static inline char *tu_golden_tail(const char *data, int no, const char *prompt)
{
    char path[4200];
    tu_path(path, sizeof(path), "%s/golden/stories260K/p%d.txt", data, no);
    char *g = tu_slurp(path, NULL);
    if (!g)
        return NULL;
    size_t n = strlen(g), np = strlen(prompt);
    if (n && g[n - 1] == '\n')
        g[--n] = '\0';
    if (n < np || strncmp(g, prompt, np)) {
        free(g);
        return NULL;
    }
    memmove(g, g + np, n - np + 1);
    return g;
}

/* Converts the bundled stories260K model with `shardlm convert` (extra args, NULL-terminated)
 * into @out. Returns the exit status. */
static inline int tu_convert(const char *out, const char *scheme, const char *const extra[])
{
    char ck[4096], tok[4096];
    tu_path(ck, sizeof(ck), "%s/models/stories260K/stories260K.bin", tu_src());
    tu_path(tok, sizeof(tok), "%s/models/stories260K/tok512.bin", tu_src());
    char *argv[16] = {(char *)tu_bin(), "convert", ck, "--tokenizer", tok, "--scheme",
                      (char *)scheme, "-o", (char *)out, "-q"};
    int n = 10;
    for (int i = 0; extra && extra[i] && n < 15; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    struct tu_run *r = malloc(sizeof(*r));
    tu_run_cmd(r, argv, NULL, 120, NULL, NULL);
    int st = r->status;
    if (st)
        fprintf(stderr, "convert %s failed (%d): %s", scheme, st, r->err);
    free(r);
    return st;
}

/* A test's random seed: SHARDLM_TEST_SEED or the clock, printed so that a failure repeats. */
static inline uint64_t tu_seed(const char *what)
{
    const char *env = getenv("SHARDLM_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    fprintf(stderr, "%s: seed %llu (SHARDLM_TEST_SEED=%llu repeats it)\n", what,
            (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

/* xorshift64* over *@s (any nonzero start; 0 becomes a fixed one). */
static inline uint64_t tu_rand(uint64_t *s)
{
    if (!*s)
        *s = 0x9e3779b97f4a7c15ull;
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

#endif
