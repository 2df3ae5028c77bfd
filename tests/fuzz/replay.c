/* SPDX-License-Identifier: MIT */
/* Corpus replay for builds without libFuzzer: runs LLVMFuzzerTestOneInput over every regular file
 * of the folder argv[1] (or over the files named as arguments), so each fuzz target is a ctest
 * over its checked-in seeds and corrupt inputs. A crash or a sanitizer report fails the test; a
 * target that returns non-zero counts as failed. Exits 0 when every input passed, 1 otherwise,
 * and 2 when nothing could be read (an empty or missing corpus is an error, not a pass). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads @path into a malloc'd buffer of exactly its size (at least 1 byte allocated so an empty
 * file is still a valid pointer). Returns NULL if it cannot be read. */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *buf = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
        *len = (size_t)st.st_size;
        buf = malloc(*len ? *len : 1);
        if (buf && fread(buf, 1, *len, f) != *len) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs one file; returns 0 if it passed. */
static int run_one(const char *path, int *ran)
{
    size_t len = 0;
    (*ran)++;
    uint8_t *buf = slurp(path, &len);
    if (!buf) {
        fprintf(stderr, "replay: %s: cannot read: %s\n", path, strerror(errno));
        return 1;
    }
    int rc = LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    if (rc) {
        fprintf(stderr, "replay: %s: target returned %d\n", path, rc);
        return 1;
    }
    return 0;
}

/* Runs every regular file of @dir in name order (so a failure is reproducible by name). */
static int run_dir(const char *dir, int *ran, int *failed)
{
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof(*names));
            if (!nn)
                abort();
            names = nn;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
            *failed += run_one(path, ran);
        free(names[i]);
    }
    free(names);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR | FILE...\n", argv[0]);
        return 2;
    }
    int ran = 0, failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 2;
        }
        if (S_ISDIR(st.st_mode)) {
            int rc = run_dir(argv[i], &ran, &failed);
            if (rc) {
                fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(-rc));
                return 2;
            }
        } else {
            failed += run_one(argv[i], &ran);
        }
    }
    printf("%d passed, %d failed\n", ran - failed, failed);
    if (ran == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 2;
    }
    return failed ? 1 : 0;
}
