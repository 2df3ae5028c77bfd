/* SPDX-License-Identifier: MIT */
/* NUMA layout of `shardlm generate` with no layout options: one worker per NUMA node, rank r on
 * node r with all of that node's CPUs, its weights and KV segments on that node.
 *
 *   test_numa SHARDLM_BIN MODEL.shlm DATA_DIR MOE_MODEL.shlm MLA_MODEL.shlm
 *
 * Arguments rather than the environment, because this runs inside tests/numa/guest.sh, where
 * nothing but the command line crosses into the guest (tests/numa/test_numa.sh converts the model
 * and starts the guest). On a machine with fewer than two nodes that have CPUs it skips (exit 77).
 *
 * golden:    the greedy text at f32 is the golden text with the ranks spread over the nodes, and
 *            --verbose reports one rank per node with that node's cpulist.
 * placement: while a slowed run is alive, the pages of every rank's weights and KV segments are on
 *            the rank's node (move_pages), every thread of the worker is confined to the node's
 *            CPUs, the workers are children of the coordinator; afterwards nothing is left.
 * experts:   a mixture of experts (tiny-qwen3moe, 16 experts) with SHARDLM_EXPERTS=ep: rank r's
 *            weights segment holds experts [16 r / n, 16 (r + 1) / n) whole and no other, every
 *            expert tensor's first and last page on the rank's node; the greedy text is the
 *            tensor-parallel placement's.
 * latent:    DeepSeek's latent attention (tiny-deepseek2, 4 heads) over the nodes: the greedy
 *            text at one rank is the text at one rank per node with either expert placement;
 *            rank r's weights segment holds the whole latent projection (attn_kv_a) and its
 *            heads' rows of attn_k_b and attn_v_b, on its node. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "testutil.h"

#define MAX_NODES 64
#define SAMPLE_PAGES 64    /* pages looked up per segment, spread over it */
#define RUN_TIMEOUT_S 300  /* one generate run; software emulation is slow */
#define PLACEMENT_N "60"   /* tokens of the slowed run: 60 steps of 100 ms keep it alive 6 s */

struct numa_node {
    int id;
    cpu_set_t cpus;
    char list[1024]; /* as in /sys/devices/system/node/node<id>/cpulist */
};

/* One `rank <r> node <n> cpus <list> pid <pid>` line of --verbose. */
struct rank_line {
    bool seen;
    int node;
    pid_t pid;
    cpu_set_t cpus;
    char list[1024];
};

static const char *bin, *model, *data; /* data: the golden outputs (tests/data) */
static const char *moe_model;          /* tiny-qwen3moe at f32 (test_expert_placement) */
static const char *mla_model;          /* tiny-deepseek2 at f32 (test_latent_attention) */
static struct numa_node nodes[MAX_NODES]; /* the nodes with CPUs, by ascending id */
static int n_nodes;
static char base[1024];   /* private folder of this test, on tmpfs */
static char rundir[1100]; /* SHARDLM_RUNTIME_DIR of every run: must be empty after each */
static char env_rundir[1200];
static pid_t live_coord;  /* a coordinator started by test_placement and not yet reaped */
static int live_err_fd = -1; /* the read end of its stderr */
static struct rank_line live_ranks[MAX_NODES];

/* Parses a Linux cpulist ("0-3,8-11", "0,2", "" for none) into @set. Returns 0 or -1. */
static int parse_cpulist(const char *s, cpu_set_t *set)
{
    CPU_ZERO(set);
    while (*s && !isspace((unsigned char)*s)) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s || lo < 0)
            return -1;
        s = end;
        if (*s == '-') {
            hi = strtol(s + 1, &end, 10);
            if (end == s + 1 || hi < lo)
                return -1;
            s = end;
        }
        if (hi >= CPU_SETSIZE)
            return -1;
        for (long c = lo; c <= hi; c++)
            CPU_SET((int)c, set);
        if (*s == ',')
            s++;
        else if (*s && !isspace((unsigned char)*s))
            return -1;
    }
    return 0;
}

static int cmp_node(const void *a, const void *b)
{
    return ((const struct numa_node *)a)->id - ((const struct numa_node *)b)->id;
}

/* Fills nodes[] with the online nodes that have CPUs (memory-only nodes do not get a rank).
 * Returns how many, or -1 if sysfs cannot be read. */
static int read_nodes(void)
{
    DIR *d = opendir("/sys/devices/system/node");
    if (!d)
        return -1;
    struct dirent *de;
    int n = 0, id;
    char extra;
    while ((de = readdir(d)) && n < MAX_NODES) {
        if (sscanf(de->d_name, "node%d%c", &id, &extra) != 1)
            continue;
        char path[512];
        tu_path(path, sizeof(path), "/sys/devices/system/node/%s/cpulist", de->d_name);
        /* not tu_slurp: sysfs reports a size (28672) that is not what a read returns */
        char list[1024];
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (!fgets(list, sizeof(list), f))
            list[0] = 0;
        fclose(f);
        list[strcspn(list, "\n")] = 0;
        if (parse_cpulist(list, &nodes[n].cpus) == 0 && CPU_COUNT(&nodes[n].cpus) > 0) {
            nodes[n].id = id;
            snprintf(nodes[n].list, sizeof(nodes[n].list), "%s", list);
            n++;
        }
    }
    closedir(d);
    qsort(nodes, (size_t)n, sizeof(nodes[0]), cmp_node);
    return n;
}

/* Parses the rank lines of a --verbose stderr into @ranks (indexed by rank, MAX_NODES entries).
 * Returns how many were found, or -1 (with a message) for a rank out of range or repeated. */
static int parse_rank_lines(const char *err, struct rank_line *ranks)
{
    memset(ranks, 0, MAX_NODES * sizeof(*ranks));
    int found = 0;
    for (const char *line = err, *nl; line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        int r, node, pid;
        char list[1024];
        if (sscanf(line, "rank %d node %d cpus %1023s pid %d", &r, &node, list, &pid) != 4)
            continue;
        if (r < 0 || r >= MAX_NODES || ranks[r].seen) {
            fprintf(stderr, "rank line with rank %d out of range or repeated\n", r);
            return -1;
        }
        ranks[r].seen = true;
        ranks[r].node = node;
        ranks[r].pid = pid;
        snprintf(ranks[r].list, sizeof(ranks[r].list), "%s", list);
        if (parse_cpulist(list, &ranks[r].cpus) < 0) {
            fprintf(stderr, "rank %d: cpus '%s' is not a cpulist\n", r, list);
            return -1;
        }
        found++;
    }
    return found;
}

/* Shows what matters of a --verbose stderr after a failure: its lines that start with "rank",
 * then its end (per-step timings fill the middle). */
static void show_stderr(const char *err)
{
    fprintf(stderr, "--- stderr lines starting with 'rank':\n");
    for (const char *line = err, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (strncmp(line, "rank", 4) == 0)
            fprintf(stderr, "%.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
    }
    size_t len = strlen(err);
    const char *tail = len > 1500 ? strchr(err + len - 1500, '\n') : NULL;
    fprintf(stderr, "--- %s of stderr:\n%s\n---\n", tail ? "end" : "all", tail ? tail + 1 : err);
}

/* The default layout: ranks 0..n_nodes-1, rank r on the r-th node with CPUs (node r wherever the
 * nodes are numbered 0..n-1, as in tests/numa/guest.sh) and exactly that node's CPUs, distinct
 * live pids. */
static void assert_rank_layout(const struct rank_line *ranks, int found, const char *err)
{
    bool ok = found == n_nodes;
    for (int r = 0; r < n_nodes; r++) {
        const struct rank_line *k = &ranks[r];
        bool good = k->seen && k->node == nodes[r].id && CPU_EQUAL(&k->cpus, &nodes[r].cpus) &&
                    k->pid > 0;
        for (int q = 0; good && q < r; q++)
            good = ranks[q].pid != k->pid;
        if (!good && k->seen)
            fprintf(stderr, "rank %d: got node %d cpus %s pid %d; want node %d cpus %s and a pid "
                    "of its own\n", r, k->node, k->list, (int)k->pid, nodes[r].id, nodes[r].list);
        else if (!good)
            fprintf(stderr, "rank %d: no line\n", r);
        ok = ok && good;
    }
    if (!ok) {
        fprintf(stderr, "want %d rank lines 'rank <r> node <n> cpus <list> pid <pid>', found %d\n",
                n_nodes, found);
        show_stderr(err);
    }
    assert_int_equal(found, n_nodes);
    assert_true(ok);
}

/* No segment, socket or other runtime file may outlive a run. */
static void assert_runtime_clean(void)
{
    int n = tu_count_run_files(rundir);
    if (n > 0) {
        char cmd[4400];
        tu_path(cmd, sizeof(cmd), "ls -la '%s' >&2", rundir);
        (void)!system(cmd);
    }
    assert_true(n <= 0);
}

/* Whether @pid runs (not a zombie) a program whose command line contains @needle. */
static bool proc_matches(pid_t pid, const char *needle)
{
    char path[64], buf[8192];
    tu_path(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) /* zombies and kernel threads have an empty command line */
        return false;
    for (ssize_t i = 0; i < n; i++)
        if (!buf[i])
            buf[i] = ' ';
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

/* No process of ours may outlive a run: neither the workers the coordinator named nor anything
 * whose command line names our runtime folder (the workers' endpoint is in it). */
static void assert_no_workers(const struct rank_line *ranks)
{
    int left = 0;
    for (int r = 0; ranks && r < MAX_NODES; r++)
        if (ranks[r].seen && proc_matches(ranks[r].pid, "shardlm-worker")) {
            fprintf(stderr, "worker rank %d (pid %d) still runs\n", r, (int)ranks[r].pid);
            left++;
        }
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        int pid = atoi(de->d_name);
        if (pid > 0 && pid != getpid() && proc_matches(pid, rundir)) {
            fprintf(stderr, "pid %d still runs with %s in its command line\n", pid, rundir);
            left++;
        }
    }
    closedir(d);
    assert_int_equal(left, 0);
}


/* Prompts 1 and 3 only: each run costs seconds under emulation, and test_e2e covers all four. */
static void test_golden_default_layout(void **state)
{
    struct tu_run *r = malloc(sizeof(*r));
    static const int prompts[] = {1, 3};
    for (size_t i = 0; i < sizeof(prompts) / sizeof(prompts[0]); i++) {
        int no = prompts[i], n_ids;
        char prompt[512], n[16], path[4200];
        assert_int_equal(tu_golden_prompt(data, no, prompt, sizeof(prompt), &n_ids), 0);
        /* the golden text holds 257 - n_ids new tokens (see test_e2e) */
        snprintf(n, sizeof(n), "%d", 257 - n_ids);
        char *argv[] = {(char *)bin, "generate", "-m", (char *)model, "-p", prompt, "-n", n,
                        "--temp", "0", "--verbose", NULL};
        char *env[] = {env_rundir, NULL};
        time_t t0 = time(NULL);
        tu_run_cmd(r, argv, env, RUN_TIMEOUT_S, NULL, NULL);
        tu_path(path, sizeof(path), "%s/golden/stories260K/p%d.txt", data, no);
        size_t glen;
        char *golden = tu_slurp(path, &glen);
        assert_non_null(golden);
        fprintf(stderr, "prompt %d: status %d in %ld s\n", no, r->status, (long)(time(NULL) - t0));
        if (r->status != 0 || r->out_len != glen || memcmp(r->out, golden, glen) != 0) {
            fprintf(stderr, "prompt %d: status %d\n--- got\n%s\n--- want\n%s\n", no, r->status,
                    r->out, golden);
            show_stderr(r->err);
        }
        struct rank_line ranks[MAX_NODES];
        int found = parse_rank_lines(r->err, ranks);
        assert_int_equal(r->status, 0);
        assert_int_equal(r->out_len, glen);
        assert_memory_equal(r->out, golden, glen);
        assert_rank_layout(ranks, found, r->err);
        free(golden);
        assert_runtime_clean();
        assert_no_workers(ranks);
    }
    free(r);
}

/* Reads @fd into @buf (NUL-terminated, at most @cap - 1 bytes kept) until @done says so, EOF or
 * @deadline. Returns 1 when done, 0 at EOF, -1 at the deadline. */
static int read_until(int fd, char *buf, size_t cap, size_t *len, time_t deadline,
                      bool (*done)(const char *))
{
    for (;;) {
        if (done && done(buf))
            return 1;
        int left = (int)(deadline - time(NULL));
        if (left <= 0)
            return -1;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, left * 1000) <= 0)
            continue;
        char tmp[4096];
        ssize_t n = read(fd, tmp, sizeof(tmp));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        size_t take = (size_t)n < cap - 1 - *len ? (size_t)n : cap - 1 - *len;
        memcpy(buf + *len, tmp, take);
        *len += take;
        buf[*len] = 0;
    }
}

static bool all_rank_lines(const char *err)
{
    struct rank_line ranks[MAX_NODES];
    return parse_rank_lines(err, ranks) >= n_nodes;
}

/* Looks up the node of up to SAMPLE_PAGES pages spread over segment @name of the coordinator
 * @coord, which should all be on @node. The pages exist already (the segment is allocated when
 * it is created): MAP_POPULATE only maps them into this process. Returns the number of problems
 * found (each printed), so that one slow run reports all of them. */
/* The name of the file in the runtime directory that ends in @suffix. */
static bool find_file(const char *suffix, char *out, size_t len)
{
    DIR *d = opendir(rundir);
    struct dirent *e;
    bool found = false;
    size_t n = strlen(suffix);
    while (d && !found && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > n && !strcmp(e->d_name + l - n, suffix)) {
            snprintf(out, len, "%s", e->d_name);
            found = true;
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* @name: a run file of the coordinator ("kv.r0"), or with @coord 0 a file name as it is */
static int check_segment_on_node(pid_t coord, const char *name, int node)
{
    char path[4400];
    if (coord)
        tu_path(path, sizeof(path), "%s/%d.%s", rundir, (int)coord, name);
    else
        tu_path(path, sizeof(path), "%s/%s", rundir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        char cmd[4400];
        tu_path(cmd, sizeof(cmd), "ls -la '%s' >&2", rundir);
        (void)!system(cmd);
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size <= 0) {
        fprintf(stderr, "%s: empty or cannot be read\n", path);
        close(fd);
        return 1;
    }
    size_t size = (size_t)st.st_size, ps = (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "%s: mmap: %s\n", path, strerror(errno));
        return 1;
    }
    size_t pages = (size + ps - 1) / ps, count = pages < SAMPLE_PAGES ? pages : SAMPLE_PAGES;
    void *addr[SAMPLE_PAGES];
    size_t idx[SAMPLE_PAGES];
    int status[SAMPLE_PAGES];
    for (size_t i = 0; i < count; i++) {
        idx[i] = count > 1 ? (pages - 1) * i / (count - 1) : 0;
        addr[i] = p + idx[i] * ps;
        status[i] = -1000;
    }
    /* nodes == NULL: only report where each page is (move_pages(2)) */
    long rc = syscall(SYS_move_pages, 0, (unsigned long)count, addr, NULL, status, 0);
    if (rc != 0) {
        fprintf(stderr, "move_pages on %s: %ld (%s)\n", path, rc, strerror(errno));
        munmap(p, size);
        return 1;
    }
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++)
        if (status[i] != node && wrong++ < 8)
            fprintf(stderr, "%s: page %zu of %zu is %s %d, want node %d\n", path, idx[i], pages,
                    status[i] < 0 ? "error" : "on node", status[i], node);
    fprintf(stderr, "%s: %zu bytes, %zu of %zu sampled pages on node %d\n", name, size,
            count - wrong, count, node);
    munmap(p, size);
    return wrong > 0;
}

/* Every thread of worker @pid may run only on @cpus. Returns the number of problems (printed). */
static int check_threads_confined(int rank, pid_t pid, const cpu_set_t *cpus)
{
    char path[64];
    tu_path(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, path, strerror(errno));
        return 1;
    }
    struct dirent *de;
    int threads = 0, bad = 0;
    while ((de = readdir(d))) {
        pid_t tid = atoi(de->d_name);
        if (tid <= 0)
            continue;
        cpu_set_t aff, outside;
        if (sched_getaffinity(tid, sizeof(aff), &aff) < 0)
            continue; /* the thread ended meanwhile */
        threads++;
        CPU_XOR(&outside, &aff, cpus);
        CPU_AND(&outside, &outside, &aff); /* CPUs allowed but not the node's */
        if (CPU_COUNT(&outside) > 0) {
            bad++;
            fprintf(stderr, "rank %d: thread %d of worker %d may run on %d CPUs outside its node "
                    "(allowed %d CPUs)\n", rank, (int)tid, (int)pid, CPU_COUNT(&outside),
                    CPU_COUNT(&aff));
        }
    }
    closedir(d);
    fprintf(stderr, "rank %d: %d threads of worker %d, %d may run outside the node's CPUs\n",
            rank, threads, (int)pid, bad);
    return bad + (threads == 0);
}

/* Parent pid of @pid from /proc/<pid>/stat (the field after the ")" of the command name). */
static pid_t parent_of(pid_t pid)
{
    char path[64];
    tu_path(path, sizeof(path), "/proc/%d/stat", (int)pid);
    char stat[1024];
    FILE *f = fopen(path, "r"); /* not tu_slurp: procfs files report size 0 */
    if (!f)
        return -1;
    if (!fgets(stat, sizeof(stat), f))
        stat[0] = 0;
    fclose(f);
    char *rp = strrchr(stat, ')');
    char state;
    int ppid = -1;
    if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2)
        ppid = -1;
    return ppid;
}

/* fork + exec of shardlm with stdout to @out_fd and stderr to a pipe whose read end is returned
 * in @err_fd. */
static pid_t start_coordinator(char *const argv[], char *const env[], int out_fd, int *err_fd)
{
    int pe[2];
    if (pipe2(pe, O_CLOEXEC))
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out_fd, 1);
        dup2(pe[1], 2);
        for (int i = 0; env[i]; i++)
            putenv(env[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pe[1]);
    *err_fd = pe[0];
    return pid;
}

static void test_placement(void **state)
{
    char outpath[4200];
    tu_path(outpath, sizeof(outpath), "%s/placement.out", base);
    int out_fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(out_fd >= 0);
    char *argv[] = {(char *)bin, "generate", "-m", (char *)model, "-p", "Once upon a time",
                    "-n", PLACEMENT_N, "--temp", "0", "--verbose", NULL};
    char *env[] = {env_rundir, "SHARDLM_FAULT=step_delay_ms=100", NULL};
    time_t t0 = time(NULL);
    int err_fd;
    pid_t coord = start_coordinator(argv, env, out_fd, &err_fd);
    close(out_fd);
    assert_true(coord > 0);
    live_coord = coord;
    live_err_fd = err_fd;

    static char err[1 << 16];
    size_t err_len = 0;
    err[0] = 0;
    int got = read_until(err_fd, err, sizeof(err), &err_len, t0 + RUN_TIMEOUT_S, all_rank_lines);
    int found = parse_rank_lines(err, live_ranks);
    fprintf(stderr, "placement: rank lines after %ld s\n", (long)(time(NULL) - t0));
    if (got != 1)
        fprintf(stderr, "the coordinator %s before printing %d rank lines\n",
                got == 0 ? "closed stderr" : "timed out", n_nodes);
    assert_rank_layout(live_ranks, found, err);

    int problems = 0;
    for (int r = 0; r < n_nodes; r++) {
        char name[256], suffix[64];
        /* the persistent weights segment "w-<model>-l<layout>-r<r>of<n>-n<node>.weights" */
        snprintf(suffix, sizeof(suffix), "-r%dof%d-n%d.weights", r, n_nodes, nodes[r].id);
        if (!find_file(suffix, name, sizeof(name))) {
            fprintf(stderr, "no weights segment *%s in %s\n", suffix, rundir);
            problems++;
        } else {
            problems += check_segment_on_node(0, name, nodes[r].id);
        }
        snprintf(name, sizeof(name), "kv.r%d", r);
        problems += check_segment_on_node(coord, name, nodes[r].id);
        problems += check_threads_confined(r, live_ranks[r].pid, &nodes[r].cpus);
        pid_t ppid = parent_of(live_ranks[r].pid);
        if (ppid != coord) {
            fprintf(stderr, "rank %d: worker %d has parent %d, want the coordinator %d\n", r,
                    (int)live_ranks[r].pid, (int)ppid, (int)coord);
            problems++;
        }
    }
    /* the checks saw a live run only if it still runs now */
    siginfo_t si = {0}; /* WNOWAIT: look, leave it to be reaped below */
    bool alive = waitid(P_PID, (id_t)coord, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && !si.si_pid;
    time_t t_checked = time(NULL);
    if (!alive)
        fprintf(stderr, "placement: the run ended during the checks; make it slower\n");
    assert_true(alive);
    assert_int_equal(problems, 0);

    /* let it finish: the slowed run outlives the checks above by seconds, not minutes */
    got = read_until(err_fd, err, sizeof(err), &err_len, t0 + RUN_TIMEOUT_S, NULL);
    close(err_fd);
    live_err_fd = -1;
    if (got < 0) {
        fprintf(stderr, "placement: run still alive after %d s; SIGTERM\n", RUN_TIMEOUT_S);
        kill(coord, SIGTERM);
    }
    int st;
    waitpid(coord, &st, 0);
    live_coord = 0;
    int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    fprintf(stderr, "placement: checks took %ld s, run ended after %ld s with status %d\n",
            (long)(t_checked - t0), (long)(time(NULL) - t0), status);
    if (status != 0)
        show_stderr(err);
    assert_int_equal(got, 0);
    assert_int_equal(status, 0);

    /* greedy decoding is deterministic: the 60 tokens begin the golden text of prompt 1 */
    char gpath[4200];
    tu_path(gpath, sizeof(gpath), "%s/golden/stories260K/p1.txt", data);
    size_t olen = 0, glen = 0;
    char *out = tu_slurp(outpath, &olen), *golden = tu_slurp(gpath, &glen);
    assert_non_null(out);
    assert_non_null(golden);
    bool prefix = olen > 1 && olen - 1 <= glen && memcmp(out, golden, olen - 1) == 0;
    if (!prefix)
        fprintf(stderr, "--- got\n%s\n--- want a prefix of\n%s\n", out, golden);
    assert_true(prefix);
    free(out);
    free(golden);

    assert_runtime_clean();
    assert_no_workers(live_ranks);
}

/* The node of the pages of @path at @offsets[0..n) (move_pages on a mapping of the file): the
 * number that are not on @node, each printed. */
static int check_offsets_on_node(const char *path, const size_t *offsets, size_t n, int node)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    size_t size = (size_t)st.st_size, ps = (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return 1;
    void **addr = calloc(n, sizeof(*addr));
    int *status = calloc(n, sizeof(*status)), wrong = 0;
    for (size_t i = 0; i < n; i++)
        addr[i] = p + (offsets[i] < size ? offsets[i] : size - 1) / ps * ps;
    long rc = syscall(SYS_move_pages, 0, (unsigned long)n, addr, NULL, status, 0);
    for (size_t i = 0; i < n; i++)
        if ((rc != 0 || status[i] != node) && wrong++ < 8)
            fprintf(stderr, "%s: the page at %zu is %s %d, want node %d\n", path, offsets[i],
                    rc != 0 || status[i] < 0 ? "error" : "on node", status[i], node);
    fprintf(stderr, "%s: %zu of the expert tensors' first and last pages on node %d\n", path,
            n - (size_t)wrong, node);
    free(addr);
    free(status);
    munmap(p, size);
    return wrong;
}

/* `shardlm generate` of "Once" on @m at temperature 0 with @env (and @workers workers where
 * not NULL); the text. */
static char *generate_on(const char *m, char *const env[], const char *workers)
{
    struct tu_run *r = malloc(sizeof(*r));
    char *argv[] = {(char *)bin,
                    "generate",
                    "-m",
                    (char *)m,
                    "-p",
                    "Once",
                    "-n",
                    "12",
                    "--temp",
                    "0",
                    workers ? "--workers" : NULL,
                    (char *)workers,
                    NULL};
    tu_run_cmd(r, argv, env, RUN_TIMEOUT_S, NULL, NULL);
    if (r->status != 0)
        show_stderr(r->err);
    assert_int_equal(r->status, 0);
    char *out = strdup(r->out);
    free(r);
    return out;
}

static void test_expert_placement(void **state)
{
    enum { EXPERTS = 16, LAYERS = 4 }; /* tiny-qwen3moe's */
    char *env_tp[] = {env_rundir, NULL}, *env_ep[] = {env_rundir, "SHARDLM_EXPERTS=ep", NULL};
    char *tp = generate_on(moe_model, env_tp, NULL), *ep = generate_on(moe_model, env_ep, NULL);
    if (strcmp(tp, ep))
        fprintf(stderr, "--- tensor-parallel\n%s\n--- expert-parallel\n%s\n", tp, ep);
    assert_string_equal(tp, ep);
    int problems = 0;
    struct tu_run *r = malloc(sizeof(*r));
    for (int rank = 0; rank < n_nodes; rank++) {
        /* the persistent segment the run left: "w-<model>-l<layout>-r<r>of<n>e-n<node>" */
        char suffix[64], name[256], path[4400];
        snprintf(suffix, sizeof(suffix), "-r%dof%de-n%d.weights", rank, n_nodes, nodes[rank].id);
        if (!find_file(suffix, name, sizeof(name))) {
            fprintf(stderr, "no weights segment *%s in %s\n", suffix, rundir);
            problems++;
            continue;
        }
        tu_path(path, sizeof(path), "%s/%s", rundir, name);
        char *argv[] = {(char *)bin, "inspect", path, NULL};
        tu_run_cmd(r, argv, env_tp, RUN_TIMEOUT_S, NULL, NULL);
        assert_int_equal(r->status, 0);
        /* its expert tensors: "  blk.L.ffn_<kind>_exp.E  dtype  R x C  B bytes at OFFSET" */
        int x0 = EXPERTS * rank / n_nodes, x1 = EXPERTS * (rank + 1) / n_nodes, found = 0;
        size_t offsets[2 * 3 * LAYERS * EXPERTS], n_off = 0;
        for (const char *line = r->out; line;
             line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
            unsigned l, x;
            char kind[32];
            unsigned long long bytes, at;
            if (sscanf(line, " blk.%u.ffn_%31[a-z]_exp.%u %*s %*s x %*s %llu bytes at %llu", &l,
                       kind, &x, &bytes, &at) != 5)
                continue;
            found++;
            if ((int)x < x0 || (int)x >= x1) {
                fprintf(stderr, "rank %d holds expert %u of layer %u, want %d..%d only\n", rank, x,
                        l, x0, x1 - 1);
                problems++;
            }
            if (n_off + 2 <= sizeof(offsets) / sizeof(offsets[0])) {
                offsets[n_off++] = (size_t)at;
                offsets[n_off++] = (size_t)(at + bytes - 1);
            }
        }
        fprintf(stderr, "rank %d: %d expert tensors (experts %d..%d) in %s\n", rank, found, x0,
                x1 - 1, name);
        if (found != 3 * LAYERS * (x1 - x0)) {
            fprintf(stderr, "rank %d: %d expert tensors, want %d\n", rank, found,
                    3 * LAYERS * (x1 - x0));
            problems++;
        }
        problems += check_offsets_on_node(path, offsets, n_off, nodes[rank].id);
        problems += check_segment_on_node(0, name, nodes[rank].id);
    }
    free(r);
    free(tp);
    free(ep);
    assert_int_equal(problems, 0);
}

static void test_latent_attention(void **state)
{
    enum { HEADS = 4, LATENT = 64, ROPE = 16, VALUE = 32 }; /* tiny-deepseek2's */
    char *env_tp[] = {env_rundir, NULL}, *env_ep[] = {env_rundir, "SHARDLM_EXPERTS=ep", NULL};
    char *one = generate_on(mla_model, env_tp, "1"), *tp = generate_on(mla_model, env_tp, NULL),
         *ep = generate_on(mla_model, env_ep, NULL);
    if (strcmp(one, tp) || strcmp(one, ep))
        fprintf(stderr, "--- one rank\n%s\n--- tensor-parallel\n%s\n--- expert-parallel\n%s\n", one,
                tp, ep);
    assert_string_equal(one, tp);
    assert_string_equal(one, ep);
    int problems = 0;
    struct tu_run *r = malloc(sizeof(*r));
    for (int rank = 0; rank < n_nodes; rank++) {
        /* the tensor-parallel runs' segments "w-<model>-l<layout>-r<r>of<n>-n<node>.weights"
         * (tiny-qwen3moe's too): the one whose tensors are latent attention's */
        char suffix[64], name[256] = "", path[4400];
        snprintf(suffix, sizeof(suffix), "-r%dof%d-n%d.weights", rank, n_nodes, nodes[rank].id);
        DIR *d = opendir(rundir);
        struct dirent *de;
        while (d && !name[0] && (de = readdir(d))) {
            size_t l = strlen(de->d_name), n = strlen(suffix);
            if (l <= n || strcmp(de->d_name + l - n, suffix))
                continue;
            tu_path(path, sizeof(path), "%s/%s", rundir, de->d_name);
            char *argv[] = {(char *)bin, "inspect", path, NULL};
            tu_run_cmd(r, argv, env_tp, RUN_TIMEOUT_S, NULL, NULL);
            assert_int_equal(r->status, 0);
            if (strstr(r->out, "blk.0.attn_k_b "))
                snprintf(name, sizeof(name), "%s", de->d_name);
        }
        if (d)
            closedir(d);
        if (!name[0]) {
            fprintf(stderr, "no weights segment of tiny-deepseek2 *%s in %s\n", suffix, rundir);
            problems++;
            continue;
        }
        /* layer 0's: "  blk.0.attn_k_b  dtype  R x C ..." */
        int heads = HEADS * (rank + 1) / n_nodes - HEADS * rank / n_nodes;
        unsigned kb = 0, vb = 0, kva = 0;
        for (const char *line = r->out; line;
             line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
            unsigned rows;
            if (sscanf(line, " blk.0.attn_k_b %*s %u x", &rows) == 1)
                kb = rows;
            else if (sscanf(line, " blk.0.attn_v_b %*s %u x", &rows) == 1)
                vb = rows;
            else if (sscanf(line, " blk.0.attn_kv_a %*s %u x", &rows) == 1)
                kva = rows;
        }
        fprintf(stderr, "rank %d: attn_k_b %u rows, attn_v_b %u, attn_kv_a %u (%d heads)\n", rank,
                kb, vb, kva, heads);
        if (kb != (unsigned)(heads * LATENT) || vb != (unsigned)(heads * VALUE) ||
            kva != LATENT + ROPE) {
            fprintf(stderr, "rank %d: want %d, %d and %d rows\n", rank, heads * LATENT,
                    heads * VALUE, LATENT + ROPE);
            problems++;
        }
        problems += check_segment_on_node(0, name, nodes[rank].id);
    }
    free(r);
    free(one);
    free(tp);
    free(ep);
    assert_int_equal(problems, 0);
}

/* After a failed assertion in test_placement: end the coordinator it started, then any worker
 * it named that is still there (only processes this test started, by pid). */
static void kill_leftovers(void **state)
{
    if (live_coord > 0) {
        kill(live_coord, SIGTERM);
        for (int i = 0; i < 50 && waitpid(live_coord, NULL, WNOHANG) == 0; i++)
            usleep(100 * 1000);
        if (waitpid(live_coord, NULL, WNOHANG) == 0) {
            kill(live_coord, SIGKILL);
            waitpid(live_coord, NULL, 0);
        }
        live_coord = 0;
    }
    for (int r = 0; r < MAX_NODES; r++)
        if (live_ranks[r].seen && proc_matches(live_ranks[r].pid, "shardlm-worker"))
            kill(live_ranks[r].pid, SIGKILL);
    if (live_err_fd >= 0)
        close(live_err_fd);
    live_err_fd = -1;
    memset(live_ranks, 0, sizeof(live_ranks));
}

static int teardown_test(void **state)
{
    kill_leftovers(state);
    return 0;
}

static int setup(void **state)
{
    /* tmpfs, like the default runtime directory: mbind applies to shmem pages */
    snprintf(base, sizeof(base), "/dev/shm/shardlm-numa-XXXXXX");
    if (!mkdtemp(base)) {
        snprintf(base, sizeof(base), "/tmp/shardlm-numa-XXXXXX");
        if (!mkdtemp(base))
            return -1;
    }
    tu_path(rundir, sizeof(rundir), "%s/run", base);
    tu_path(env_rundir, sizeof(env_rundir), "SHARDLM_RUNTIME_DIR=%s", rundir);
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(base);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s SHARDLM_BIN MODEL.shlm DATA_DIR MOE_MODEL.shlm MLA_MODEL.shlm\n",
                argv[0]);
        return 2;
    }
    bin = argv[1];
    model = argv[2];
    data = argv[3];
    moe_model = argv[4];
    mla_model = argv[5];
    n_nodes = read_nodes();
    if (n_nodes < 2) {
        fprintf(stderr, "SKIP: needs >= 2 NUMA nodes; ctest runs it in a guest that has them "
                "(tests/numa/test_numa.sh NODES BUILD_DIR DATA_DIR)\n");
        return 77;
    }
    char p[4200];
    tu_path(p, sizeof(p), "%s/golden/stories260K/greedy.tsv", data);
    if (access(bin, X_OK) || access(model, R_OK) || access(p, R_OK)) {
        fprintf(stderr, "test_numa: cannot use %s, %s or %s: %s\n", bin, model, p,
                strerror(errno));
        return 1;
    }
    fprintf(stderr, "%d NUMA nodes with CPUs:", n_nodes);
    for (int i = 0; i < n_nodes; i++)
        fprintf(stderr, " node%d=%s", nodes[i].id, nodes[i].list);
    fprintf(stderr, "\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_default_layout),
        cmocka_unit_test_teardown(test_placement, teardown_test),
        cmocka_unit_test(test_expert_placement),
        cmocka_unit_test(test_latent_attention),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
