/* SPDX-License-Identifier: MIT */
/* coordinator/cli/options.c: what the commands share - the engine options (layout, load, access,
 * restarts) and their parsing, the environment and log the engine gets, number parsing, the exit
 * code of a failed command. */
#include "cli.h"

#include "chat.h"

#include "kn.h"
#include "scheduler.h"
#include "tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <math.h>

bool coord_cli_parse_double(const char *s, double lo, double hi, double *out)
{
    /* plain decimals, as the integer flags take them: no exponent ("1e3"), hex, inf or space */
    size_t digits = strspn(s + (*s == '-'), "0123456789.");
    if (!s[0] || s[(*s == '-') + digits] || strchr(s, '.') != strrchr(s, '.') ||
        !strpbrk(s, "0123456789"))
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool coord_cli_parse_float(const char *s, float lo, float hi, float *out)
{
    double d;
    if (!coord_cli_parse_double(s, lo, hi, &d))
        return false;
    float v = (float)d;
    if (v < lo || v > hi) /* rounded to float past a bound */
        return false;
    *out = v;
    return true;
}

/* The options of every command that starts the engine: layout (--workers/--threads/--cpus),
 * load (--no-persist/--io/--stats), access (--listen/--keys), --restarts, -m and --verbose.
 * Returns 1 if @c was one of them, 0 if not, -1 on a bad value with @why naming the option and
 * what it takes. */
int coord_cli_engine_option(int c, struct coord_engine_opts *o, char *why, size_t len)
{
    long v;
    const char *opt, *want; /* for a bad value */
    switch (c) {
    case 'W':
        if (!coord_parse_long(optarg, 1, 256, &v)) {
            opt = "--workers", want = "a count 1..256";
            goto bad;
        }
        o->layout.workers = (int)v;
        return 1;
    case 'H':
        if (!coord_parse_long(optarg, 1, 4096, &v)) {
            opt = "--threads", want = "a count 1..4096";
            goto bad;
        }
        o->layout.threads = (int)v;
        return 1;
    case 'C':
        o->layout.cpus = optarg;
        return 1;
    case 'N':
        o->load.no_persist = true;
        return 1;
    case 'I':
        if (coord_io_parse(optarg, &o->load.io)) {
            opt = "--io", want = "auto, direct or buffered";
            goto bad;
        }
        return 1;
    case 'Z':
        o->load.stats = true;
        return 1;
    case 'V':
        o->load.verify = true;
        return 1;
    case 'L':
        o->access.listen = optarg;
        return 1;
    case 'K':
        if (!*optarg) {
            opt = "--keys", want = "a folder's path";
            goto bad;
        }
        o->access.keys = optarg;
        return 1;
    case 'X': /* 0 asks for none: the engine's -1 (its 0 is the default) */
        if (!coord_parse_long(optarg, 0, 100, &v)) {
            opt = "--restarts", want = "a count 0..100";
            goto bad;
        }
        o->restarts = v ? (int)v : -1;
        return 1;
    case 'm':
        if (!*optarg) {
            opt = "-m", want = "a model file's path";
            goto bad;
        }
        o->model_path = optarg;
        return 1;
    case 'v':
        o->verbose = true;
        return 1;
    }
    return 0;
bad:
    snprintf(why, len, "%s '%s': expected %s", opt, optarg, want);
    return -1;
}

const char *coord_cli_version;

int coord_cli_engine_env(struct coord_engine_opts *o, struct shardlm_err *e)
{
    char err[256];
    o->log = coord_cli_log;
    o->cancel = &coord_stop_signal;
    o->worker_path = getenv("SHARDLM_WORKER");
    o->rundir = getenv("SHARDLM_RUNTIME_DIR"); /* main() refused an empty one */
    const char *lim = getenv("SHARDLM_SHM_LIMIT"); /* main() refused one not a number >= 1 */
    o->shm_limit = lim ? strtoull(lim, NULL, 10) : 0;
    o->isa = getenv("SHARDLM_ISA");
    if (o->isa && !*o->isa)
        o->isa = NULL;
    if (o->isa && !kn_ops_find(o->isa, err, sizeof(err)))
        return shardlm_fail(e, -ENOTSUP, "SHARDLM_ISA=%s: %s", o->isa, err);
    const char *pf = getenv("SHARDLM_PREFETCH"); /* on to the workers' command line */
    if (pf && *pf && kn_pf_parse(pf) < -1)
        return shardlm_fail(e, -EINVAL, "SHARDLM_PREFETCH=%s: expected auto, hw, l1 or l2", pf);
    o->prefetch = pf && *pf ? pf : NULL;
    const char *ex = getenv("SHARDLM_EXPERTS");
    if (ex && *ex && strcmp(ex, "tp") && strcmp(ex, "ep"))
        return shardlm_fail(e, -EINVAL, "SHARDLM_EXPERTS=%s: expected tp or ep", ex);
    o->load.experts = ex && !strcmp(ex, "ep") ? SEG_EXPERTS_EP : SEG_EXPERTS_TP;
    return 0;
}

void coord_cli_log(void *ctx, enum coord_log_level level, const char *msg)
{
    fprintf(stderr, "%s%s\n", level == COORD_LOG_DEBUG ? "" : "shardlm: ", msg);
}

int coord_usage_error(const char *cmd, const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "shardlm %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n%s", usage);
    va_end(ap);
    return 2;
}

int coord_cli_empty_path(const char *cmd, const char *usage, const char *opt)
{
    return coord_usage_error(cmd, usage, "%s '': expected a path (an empty one names no file)",
                             opt);
}

int coord_cli_getopt(const struct coord_cli_cmd *cmd, int argc, char **argv, int *exit_code)
{
    int c = getopt_long(argc, argv, cmd->shortopts, cmd->longopts, NULL);
    if (c == 'h') {
        fputs(cmd->usage, stdout);
        *exit_code = 0;
        return COORD_CLI_EXIT;
    }
    if (c == '?' && cmd->shortopts[0] != ':') {
        fputs(cmd->usage, stderr);
        *exit_code = 2;
        return COORD_CLI_EXIT;
    }
    for (const struct coord_cli_path *p = cmd->paths; c > 0 && p && p->code; p++)
        if (p->code == c && !*optarg) {
            *exit_code = coord_cli_empty_path(cmd->name, cmd->usage, p->name);
            return COORD_CLI_EXIT;
        }
    return c;
}

int coord_cli_parse_engine(const struct coord_cli_cmd *cmd, int argc, char **argv,
                           struct coord_engine_opts *eo, struct coord_sched_opts *so,
                           int (*own)(int c, void *arg), void *arg)
{
    int c, rc;
    while ((c = coord_cli_getopt(cmd, argc, argv, &rc)) != -1) {
        if (c == COORD_CLI_EXIT)
            return rc;
        char why[160];
        int eo_rc = so ? coord_cli_run_option(c, eo, so, why, sizeof(why))
                       : coord_cli_engine_option(c, eo, why, sizeof(why));
        if (eo_rc < 0)
            return coord_usage_error(cmd->name, cmd->usage, "%s", why);
        if (!eo_rc && own && (rc = own(c, arg)) >= 0)
            return rc;
    }
    if (optind != argc)
        return coord_cli_extra_argument(cmd->name, cmd->usage, argv);
    return -1;
}

int coord_cli_check_kv(const struct coord_cli_cmd *cmd, const struct coord_engine_opts *eo)
{
    if (eo->kv_blocks && eo->kv_mem)
        return coord_usage_error(cmd->name, cmd->usage,
                                 "--kv-tokens and --kv-mem both size the KV cache: give one");
    return -1;
}

int coord_cli_word(const struct coord_cli_word *words, const char *name)
{
    for (const struct coord_cli_word *w = words; w->name; w++)
        if (strcmp(w->name, name) == 0)
            return w->value;
    return -1;
}

int coord_cli_extra_argument(const char *cmd, const char *usage, char **argv)
{
    return coord_usage_error(cmd, usage,
                             "unexpected argument '%s' (a prompt with spaces needs "
                             "quotes)",
                             argv[optind]);
}

int coord_cli_exit(const char *cmd, int rc, const struct shardlm_err *e)
{
    if (rc == 0)
        return 0;
    if ((rc == -ECANCELED || rc == -EINTR) && coord_stop_signal) {
        fprintf(stderr, "shardlm %s: stopped by signal %d\n", cmd, (int)coord_stop_signal);
        return 128 + (int)coord_stop_signal;
    }
    /* every failure says something, even one whose message nobody set; one that still holds a
     * control character (a template's raise_exception text, a client's string) is escaped, so
     * that no file or request writes to the terminal (those escaped already have none) */
    const char *msg = e->msg[0] ? e->msg : strerror(-rc);
    char safe[4 * sizeof(e->msg)];
    for (const char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) {
            msg = coord_escape_str(safe, sizeof(safe), msg);
            break;
        }
    fprintf(stderr, "shardlm %s: %s\n", cmd, msg);
    return 1;
}

bool coord_cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!*s || *s == '-' || *s == '+')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return false;
    int shift = 0;
    if (*end) {
        const char *units = "KMG", *u = strchr(units, *end);
        if (!u || end[1])
            return false;
        shift = 10 * (int)(u - units + 1);
    }
    if (v == 0 || v > (1ull << 50) >> shift)
        return false;
    *out = (uint64_t)v << shift;
    return true;
}

int coord_cli_sched_option(int c, struct coord_engine_opts *eo, struct coord_sched_opts *so,
                           char *why, size_t len)
{
    long v;
    uint64_t size;
    const char *opt, *want;
    switch (c) {
    case 1000:
        if (!coord_parse_long(optarg, 1, 256, &v)) {
            opt = "--max-seqs", want = "a count 1..256";
            goto bad;
        }
        eo->max_seqs = so->max_seqs = (uint32_t)v;
        return 1;
    case 1001:
        if (!coord_parse_long(optarg, 1, 1 << 20, &v)) {
            opt = "--step-tokens", want = "a count 1..1048576";
            goto bad;
        }
        so->step_tokens = (uint32_t)v;
        return 1;
    case 1002:
        if (!coord_parse_long(optarg, 1, 1l << 34, &v)) {
            opt = "--kv-tokens", want = "a count of positions 1..2^34";
            goto bad;
        }
        eo->kv_blocks = coord_kv_blocks_for((uint64_t)v);
        return 1;
    case 1003:
        if (!coord_cli_parse_size(optarg, &size)) {
            opt = "--kv-mem", want = "a size such as 512M or 8G";
            goto bad;
        }
        eo->kv_mem = size;
        return 1;
    case 1004:
        so->no_prefix_cache = true;
        eo->kv_no_prefixes = true;
        return 1;
    }
    return 0;
bad:
    snprintf(why, len, "%s '%s': expected %s", opt, optarg, want);
    return -1;
}

int coord_cli_run_option(int c, struct coord_engine_opts *eo, struct coord_sched_opts *so,
                         char *why, size_t len)
{
    int r = coord_cli_engine_option(c, eo, why, len);
    return r ? r : coord_cli_sched_option(c, eo, so, why, len);
}

int coord_cli_open_tok(const char *path, long vocab_size, struct coord_tok *t, void **map,
                       size_t *size, struct shardlm_err *e)
{
    int rc = coord_map_nonempty(path, map, size, e);
    if (rc == 0 && (rc = coord_tok_from_image(t, *map, *size, vocab_size, path, e)))
        munmap(*map, *size);
    return rc;
}

int coord_cli_load_template(const char *path, const char *bos, const char *eos,
                            struct coord_chat_tmpl *t, char **text, struct shardlm_err *e)
{
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(path, COORD_CHAT_TEMPLATE_MAX, &buf, &len, e);
    if (rc)
        return rc;
    char why[300];
    if ((rc = coord_chat_tmpl_init(t, (const char *)buf, len, bos, eos, why, sizeof(why)))) {
        free(buf);
        return shardlm_fail(e, rc, "%s: %s", path, why);
    }
    char *s = text ? realloc(buf, len + 1) : NULL;
    if (text && !s) {
        coord_chat_tmpl_free(t);
        free(buf);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    if (text) {
        s[len] = 0;
        *text = s;
    } else {
        free(buf);
    }
    return 0;
}
