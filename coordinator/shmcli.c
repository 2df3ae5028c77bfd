/* coordinator/: `shardlm shm list|purge` - the segments in the runtime directory. */
#include "shmcli.h"

#include "seg.h"
#include "shlm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage_shm[] =
    "usage: shardlm shm list | purge\n"
    "\n"
    "The runtime directory ($SHARDLM_RUNTIME_DIR, default /dev/shm/shardlm-<uid>) holds the\n"
    "persistent weights segments, which let the next generate on the same model and layout start\n"
    "without reading the file, and the run files (KV, exchange, socket) of live coordinators.\n"
    "  list    each file: name, bytes, what it is (a complete weights segment names its model's\n"
    "          checksum and its shard; a run file its coordinator, alive or dead)\n"
    "  purge   removes the weights segments and the run files of dead coordinators, and prints\n"
    "          what it freed. Processes that map a removed segment keep it until they exit.\n";

/* One line describing the persistent segment @path of @size bytes. */
static void describe_weights(const char *path, uint64_t size, char *out, size_t len)
{
    struct seg s;
    struct shlm_model m;
    char err[256];
    if (seg_map(&s, path, size, false)) {
        snprintf(out, len, "unreadable");
        return;
    }
    if (shlm_parse(&m, s.base, s.size, path, err, sizeof(err)) || !m.hdr->shard_count)
        snprintf(out, len, "incomplete (a load that did not finish; rebuilt on next use)");
    else
        snprintf(out, len, "complete: model %016llx, %s, shard %u of %u",
                 (unsigned long long)m.hdr->source_checksum,
                 shlm_scheme_name((enum shlm_scheme)m.hdr->scheme), m.hdr->shard_rank,
                 m.hdr->shard_count);
    seg_free(&s);
}

static int walk(const char *rundir, bool purge)
{
    DIR *d = opendir(rundir);
    if (!d) {
        if (errno == ENOENT) {
            printf("%s: no runtime directory, nothing %s\n", rundir, purge ? "to remove" : "there");
            return 0;
        }
        fprintf(stderr, "shardlm shm: %s: %s\n", rundir, strerror(errno));
        return 1;
    }
    struct dirent *e;
    int n = 0, removed = 0;
    uint64_t freed = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX + NAME_MAX + 2], what[160];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", rundir, e->d_name);
        if (lstat(path, &st) < 0)
            continue;
        pid_t pid = seg_run_pid(e->d_name);
        bool weights = !strncmp(e->d_name, SEG_PERSIST_PREFIX, strlen(SEG_PERSIST_PREFIX));
        bool dead = pid && !seg_pid_alive(pid);
        if (weights && S_ISREG(st.st_mode))
            describe_weights(path, (uint64_t)st.st_size, what, sizeof(what));
        else if (pid)
            snprintf(what, sizeof(what), "run file of coordinator %d (%s)", (int)pid,
                     dead ? "dead" : "alive");
        else
            snprintf(what, sizeof(what), "not ours");
        n++;
        if (!purge) {
            printf("%-56s %12llu  %s\n", e->d_name, (unsigned long long)st.st_size, what);
            continue;
        }
        if ((weights || dead) && unlink(path) == 0) {
            printf("removed %s (%llu bytes)\n", e->d_name, (unsigned long long)st.st_size);
            removed++;
            freed += (uint64_t)st.st_size;
        }
    }
    closedir(d);
    if (purge)
        printf("%d file%s removed, %llu bytes freed\n", removed, removed == 1 ? "" : "s",
               (unsigned long long)freed);
    else if (!n)
        printf("%s: empty\n", rundir);
    return 0;
}

int coord_cmd_shm(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage_shm, stdout);
        return 0;
    }
    if (argc != 2 || (strcmp(argv[1], "list") && strcmp(argv[1], "purge"))) {
        fprintf(stderr, "shardlm shm: expected list or purge\n%s", usage_shm);
        return 2;
    }
    char rundir[PATH_MAX];
    int rc = seg_rundir(rundir, sizeof(rundir));
    if (rc) {
        fprintf(stderr, "shardlm shm: runtime directory %s: %s\n", rundir,
                rc == -EPERM ? "not a private directory owned by this user" : strerror(-rc));
        return 1;
    }
    return walk(rundir, !strcmp(argv[1], "purge"));
}
