/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_shm.c: `shardlm shm list|purge` - the segments in the runtime directory. */
#include "cli.h"

#include "seg.h"
#include "shlm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage_shm[] =
    "usage: shardlm shm list | purge [--force] | verify\n"
    "\n"
    "The runtime directory ($SHARDLM_RUNTIME_DIR, default /dev/shm/shardlm-<uid>) holds the\n"
    "persistent weights segments, which let the next generate on the same model and layout start\n"
    "without reading the file, and the run files (KV, exchange, socket) of live coordinators.\n"
    "  list    each file: name, bytes, what it is (a complete weights segment names its model's\n"
    "          checksum and its shard; a run file its coordinator, alive or dead)\n"
    "  purge   removes the weights segments and the run files of dead coordinators, and prints\n"
    "          what it freed. A weights segment that a live engine maps is kept and named, unless\n"
    "          --force (the engine keeps its mapping, but a worker it restarts cannot attach).\n"
    "  verify  reads every complete weights segment and checks its data against its tensors'\n"
    "          checksums (a warm start trusts the header alone; --verify on a start checks the\n"
    "          segments it maps); exit 1 if one is corrupt (`purge` removes it)\n"
    "Only names of the forms shardlm makes are listed as its own or ever removed.\n";

/* One line describing the persistent segment @path of @size bytes. */
static void describe_weights(const char *path, uint64_t size, char *out, size_t len)
{
    struct seg s;
    struct shlm_model m;
    struct shardlm_err err;
    if (seg_map(&s, path, size, false)) {
        snprintf(out, len, "unreadable");
        return;
    }
    if (shlm_parse(&m, s.base, s.size, path, &err) || !m.hdr->shard_count)
        snprintf(out, len, "incomplete (a load that did not finish; rebuilt on next use)");
    else
        snprintf(out, len, "complete: model %016llx, %s, shard %u of %u",
                 (unsigned long long)m.hdr->source_checksum,
                 shlm_scheme_name((enum shlm_scheme)m.hdr->scheme), m.hdr->shard_rank,
                 m.hdr->shard_count);
    seg_free(&s);
}

enum entry_kind { ENTRY_FOREIGN, ENTRY_WEIGHTS, ENTRY_RUN_ALIVE, ENTRY_RUN_DEAD };

/* What the entry @name (lstat @st) of the runtime directory is: one of ours only when its name
 * has one of our forms exactly and its type is the one we make (list and purge agree by asking
 * this alone). */
static enum entry_kind classify(const char *name, const struct stat *st)
{
    pid_t pid = seg_run_pid(name);
    if (pid && (S_ISREG(st->st_mode) || S_ISSOCK(st->st_mode)))
        return seg_pid_alive(pid) ? ENTRY_RUN_ALIVE : ENTRY_RUN_DEAD;
    if (seg_is_weights_name(name) && S_ISREG(st->st_mode))
        return ENTRY_WEIGHTS;
    return ENTRY_FOREIGN;
}

/* Opens the weights segment @path and tries its exclusive lock: a descriptor holding it (the
 * segment is not in use), or -EBUSY while an engine maps it (seg_map's shared lock). */
static int lock_unused(const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        close(fd);
        return rc;
    }
    return fd;
}

/* `shm verify` of the weights segment @path: prints its verdict; false if it is corrupt. */
static bool verify_weights(const char *name, const char *path, uint64_t size)
{
    struct seg s;
    struct shlm_model m;
    struct shardlm_err err;
    int rc = seg_map(&s, path, size, false);
    if (rc) {
        printf("%-56s unreadable: %s\n", name, strerror(-rc));
        return false;
    }
    if ((rc = shlm_parse(&m, s.base, s.size, path, &err)) || !m.hdr->shard_count)
        printf("%-56s incomplete (rebuilt on next use)\n", name);
    else if ((rc = shlm_verify_data(&m, name, &err)))
        printf("%-56s CORRUPT: %s\n", name, err.msg);
    else
        printf("%-56s ok, %u tensors\n", name, m.hdr->n_tensors);
    seg_free(&s);
    return rc == 0;
}

enum walk_mode { WALK_LIST, WALK_PURGE, WALK_VERIFY };

static int walk(const char *rundir, enum walk_mode mode, bool force)
{
    DIR *d = opendir(rundir);
    if (!d) {
        if (errno == ENOENT) {
            printf("%s: no runtime directory, nothing %s\n", rundir,
                   mode == WALK_PURGE ? "to remove" : "there");
            return 0;
        }
        fprintf(stderr, "shardlm shm: %s: %s\n", rundir, strerror(errno));
        return 1;
    }
    struct dirent *e;
    bool purge = mode == WALK_PURGE;
    int n = 0, removed = 0, kept = 0, corrupt = 0;
    uint64_t freed = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX + NAME_MAX + 2], what[200];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", rundir, e->d_name);
        if (lstat(path, &st) < 0)
            continue;
        enum entry_kind kind = classify(e->d_name, &st);
        if (mode == WALK_VERIFY) {
            if (kind == ENTRY_WEIGHTS) {
                n++;
                corrupt += !verify_weights(e->d_name, path, (uint64_t)st.st_size);
            }
            continue;
        }
        int lock = kind == ENTRY_WEIGHTS ? lock_unused(path) : -1;
        bool in_use = lock == -EBUSY;
        n++;
        if (!purge) {
            if (lock >= 0)
                close(lock);
            if (kind == ENTRY_WEIGHTS) {
                describe_weights(path, (uint64_t)st.st_size, what, sizeof(what));
                strncat(what, in_use ? ", in use" : "", sizeof(what) - strlen(what) - 1);
            } else if (kind == ENTRY_FOREIGN) {
                snprintf(what, sizeof(what), "not ours");
            } else {
                snprintf(what, sizeof(what), "run file of coordinator %d (%s)",
                         (int)seg_run_pid(e->d_name), kind == ENTRY_RUN_DEAD ? "dead" : "alive");
            }
            printf("%-56s %12llu  %s\n", e->d_name, (unsigned long long)st.st_size, what);
            continue;
        }
        bool go = kind == ENTRY_RUN_DEAD || (kind == ENTRY_WEIGHTS && (lock >= 0 || force));
        if (kind == ENTRY_WEIGHTS && !go) {
            printf("kept %s: %s\n", e->d_name,
                   in_use ? "in use by a live engine (--force removes it)" : strerror(-lock));
            kept++;
        }
        /* unlinked while the lock is held: an engine that opened it meanwhile sees it gone */
        if (go && unlink(path) == 0) {
            printf("removed %s (%llu bytes)\n", e->d_name, (unsigned long long)st.st_size);
            removed++;
            freed += (uint64_t)st.st_size;
        }
        if (lock >= 0)
            close(lock);
    }
    closedir(d);
    if (mode == WALK_VERIFY) {
        printf("%d weights segment%s checked, %d corrupt\n", n, n == 1 ? "" : "s", corrupt);
        return corrupt ? 1 : 0;
    }
    if (purge)
        printf("%d file%s removed, %llu bytes freed%s\n", removed, removed == 1 ? "" : "s",
               (unsigned long long)freed, kept ? ", segments in use kept" : "");
    else if (!n)
        printf("%s: empty\n", rundir);
    return 0;
}

/* The words after `shm`: a walk's mode, or the help. */
#define SHM_HELP 3
static const struct coord_cli_word shm_words[] = {{"list", WALK_LIST},     {"purge", WALK_PURGE},
                                                  {"verify", WALK_VERIFY}, {"--help", SHM_HELP},
                                                  {"-h", SHM_HELP},        {NULL, 0}};

int coord_cmd_shm(int argc, char **argv)
{
    int mode = argc >= 2 ? coord_cli_word(shm_words, argv[1]) : -1;
    if (mode == SHM_HELP && argc == 2) {
        fputs(usage_shm, stdout);
        return 0;
    }
    bool force = mode == WALK_PURGE && argc == 3 && !strcmp(argv[2], "--force");
    if (mode < 0 || mode == SHM_HELP || argc > 3 || (argc == 3 && !force)) {
        fprintf(stderr, "shardlm shm: expected list, purge, purge --force or verify\n%s",
                usage_shm);
        return 2;
    }
    char rundir[PATH_MAX];
    int rc = seg_rundir(getenv("SHARDLM_RUNTIME_DIR"), rundir, sizeof(rundir));
    if (rc) {
        fprintf(stderr, "shardlm shm: runtime directory %s: %s\n", rundir,
                rc == -EPERM ? "not a private directory owned by this user" : strerror(-rc));
        return 1;
    }
    return walk(rundir, (enum walk_mode)mode, force);
}
