/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cli.h: the commands of `shardlm` and what they share. Each command gets argv
 * starting at its own name, parses its options, runs, and returns the exit code: 0 ok, 1 failure
 * (one line "shardlm <command>: <what went wrong>" on stderr), 2 bad usage (that line and the
 * usage), 128 + signal when a signal stopped it. --help prints the usage to stdout and returns 0.
 */
#ifndef SHARDLM_COORD_CLI_H
#define SHARDLM_COORD_CLI_H

#include "engine.h"
#include "util.h"

#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int coord_cmd_convert(int argc, char **argv);
int coord_cmd_synth(int argc, char **argv);
int coord_cmd_inspect(int argc, char **argv);
int coord_cmd_tokenize(int argc, char **argv);
int coord_cmd_generate(int argc, char **argv);
int coord_cmd_serve(int argc, char **argv);
int coord_cmd_template(int argc, char **argv);
int coord_cmd_load(int argc, char **argv);
int coord_cmd_shm(int argc, char **argv);
int coord_cmd_keygen(int argc, char **argv);
int coord_cmd_eval(int argc, char **argv);
int coord_cmd_bench(int argc, char **argv);

/* The help of the engine options, for each engine command's usage text. */
#define LAYOUT_HELP                                                                                \
    "  --workers N     tensor-parallel workers (default: one per NUMA node, all its CPUs;\n"       \
    "                  more workers than nodes split the nodes' CPUs)\n"                           \
    "  --threads T     threads per worker (default: one per CPU of the worker)\n"                  \
    "  --cpus LIST     each worker's CPUs, workers separated by ':' (e.g. 0-3:4-7); CPUs may be\n" \
    "                  shared between workers this way\n"

#define ACCESS_HELP                                                                                \
    "  --listen EP     where workers reach the coordinator: tcp (127.0.0.1, a free port) or\n"     \
    "                  tcp://HOST:PORT (default: a socket in the private runtime directory)\n"     \
    "  --keys DIR      CURVE keys of `shardlm keygen`: encrypt the connection and admit only\n"    \
    "                  workers holding DIR/worker.key (required for an address off loopback)\n"

#define LOAD_HELP                                                                                  \
    "  --no-persist    weights in memfds that go with the processes; by default each worker's\n"   \
    "                  weights stay in the runtime directory, so the next start on the same "      \
    "model\n"                                                                                      \
    "                  and layout maps them instead of reading the file (`shardlm shm purge`)\n"   \
    "  --verify        check such a segment's data against its checksums before using it (a\n"     \
    "                  warm start trusts its header alone; `shardlm shm verify` checks them "      \
    "all)\n"                                                                                       \
    "  --io MODE       how the file is read: auto (default: buffered when it is in the page "      \
    "cache,\n"                                                                                     \
    "                  else O_DIRECT), direct (buffered where the filesystem refuses O_DIRECT)\n"  \
    "                  or buffered\n"                                                              \
    "  --restarts N    a worker that dies is started again on its CPUs over the same segments "    \
    "and\n"                                                                                        \
    "                  the step re-run, up to N times per step (default 3; 0: fail at once)\n"     \
    "  --stats         load report on stderr: bytes read and GB/s, segments, peak anonymous\n"     \
    "                  memory per process, time to ready (and to the first token); last line\n"    \
    "                  load segments_bytes=<n> peak_anon_bytes=<n> seconds=<s>\n"

/* The getopt_long entries of the engine options (each command's own follow or precede them). */
#define ENGINE_OPTIONS                                                                             \
    {"model", required_argument, 0, 'm'}, {"verbose", no_argument, 0, 'v'},                        \
        {"workers", required_argument, 0, 'W'}, {"threads", required_argument, 0, 'H'},            \
        {"cpus", required_argument, 0, 'C'}, {"no-persist", no_argument, 0, 'N'},                  \
        {"io", required_argument, 0, 'I'}, {"stats", no_argument, 0, 'Z'},                         \
        {"verify", no_argument, 0, 'V'}, {"listen", required_argument, 0, 'L'},                    \
        {"keys", required_argument, 0, 'K'},                                                       \
    {                                                                                              \
        "restarts", required_argument, 0, 'X'                                                      \
    }

/* The scheduler's options (`generate`, and the server's): help, getopt_long entries (codes from
 * 1000 up, apart from every command's letters) and what they set. */
#define SCHED_HELP                                                                                 \
    "  --max-seqs N    sequences run at once (default: generate the prompts, at most 16; serve\n"  \
    "                  16)\n"                                                                      \
    "  --step-tokens N tokens one step carries: each running sequence's next token, then chunks\n" \
    "                  of prompts (default 256)\n"                                                 \
    "  --kv-tokens N   positions of KV cache all sequences share, in blocks of 16 (default: a\n"   \
    "                  context per sequence, within half the memory free on the node); more\n"     \
    "                  than 7/8 of the memory available holds, or with --no-prefix-cache more\n"   \
    "                  than --max-seqs contexts, is capped there, said on stderr (past the\n"      \
    "                  contexts, blocks keep cached prefixes)\n"                                   \
    "  --kv-mem SIZE   the KV cache in bytes over all workers instead (suffix K, M or G)\n"        \
    "  --no-prefix-cache\n"                                                                        \
    "                  compute every prompt in full (by default a prompt's full blocks that an\n"  \
    "                  earlier one computed are reused)\n"
#define SCHED_OPTIONS                                                                              \
    {"max-seqs", required_argument, 0, 1000}, {"step-tokens", required_argument, 0, 1001},         \
        {"kv-tokens", required_argument, 0, 1002}, {"kv-mem", required_argument, 0, 1003},         \
    {                                                                                              \
        "no-prefix-cache", no_argument, 0, 1004                                                    \
    }
struct coord_sched_opts;
/* One of SCHED_OPTIONS into @eo (max_seqs, the KV cache's size) and @so. Returns 1 if @c was
 * one, 0 if not, -1 on a bad value with @why set. */
int coord_cli_sched_option(int c, struct coord_engine_opts *eo, struct coord_sched_opts *so,
                           char *why, size_t len);
/* coord_cli_engine_option(), then coord_cli_sched_option(): the commands that run sequences
 * (generate, serve) take both. Returns 1, 0 or -1 as they do. */
int coord_cli_run_option(int c, struct coord_engine_opts *eo, struct coord_sched_opts *so,
                         char *why, size_t len);
/* A size: digits with an optional K, M or G (powers of 1024), within [1, 2^50]. */
bool coord_cli_parse_size(const char *s, uint64_t *out);
/* --chat-template @path (serve, template): reads the file (regular, at most
 * COORD_CHAT_TEMPLATE_MAX bytes) and parses it into *@t with @bos / @eos; with @text, its text
 * too (malloc'd, NUL-terminated). Returns 0 or -errno with @e naming the file and the line. */
struct coord_chat_tmpl;
/* Maps @path and reads the tokenizer it holds (coord_tok_from_image, @vocab_size as there) into
 * @t; the mapping (*@map, *@size) must outlive @t: munmap() it after coord_tok_free(). Returns 0
 * or -errno with @e set (nothing left mapped). */
struct coord_tok;
int coord_cli_open_tok(const char *path, long vocab_size, struct coord_tok *t, void **map,
                       size_t *size, struct shardlm_err *e);
int coord_cli_load_template(const char *path, const char *bos, const char *eos,
                            struct coord_chat_tmpl *t, char **text, struct shardlm_err *e);
/* One of the engine options (@c from getopt_long, its value in optarg) into @o. Returns 1 if @c
 * was one of them, 0 if not, -1 on a bad value with @why naming the option and what it takes. */
int coord_cli_engine_option(int c, struct coord_engine_opts *o, char *why, size_t len);
/* What the process gives the engine besides the options: the log (coord_cli_log), the cancel
 * flag (coord_stop_signal), and from the environment the worker binary (SHARDLM_WORKER), the
 * kernel table (SHARDLM_ISA) and the runtime directory (SHARDLM_RUNTIME_DIR). Returns 0, or
 * -ENOTSUP with @e set for a SHARDLM_ISA this build or CPU cannot run. */
int coord_cli_engine_env(struct coord_engine_opts *o, struct shardlm_err *e);
/* The engine's log callback for every command: one line on stderr per message, "shardlm: "
 * before the INFO and WARN ones (DEBUG lines are a format tools read: printed as they are). */
void coord_cli_log(void *ctx, enum coord_log_level level, const char *msg);
/* The load and memory report of `--stats` on @f, ending with the line scripts read:
 *   load segments_bytes=<n> peak_anon_bytes=<n> seconds=<s>
 * @first_token_ns: when the first token came (0: none). */
void coord_cli_print_stats(struct coord_engine *g, uint64_t first_token_ns, FILE *f);
/* A one-line "shardlm CMD: message" and the usage text on stderr; returns exit code 2. */
int coord_usage_error(const char *cmd, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An argument left after an engine command's options: the usage error naming it (exit code 2). */
int coord_cli_extra_argument(const char *cmd, const char *usage, char **argv);
/* The exit code of command @cmd that returned @rc (0 or -errno with @e set), after printing its
 * one-line error: 128 + signal when a signal stopped it (-ECANCELED, or -EINTR, after one), else
 * 1. */
int coord_cli_exit(const char *cmd, int rc, const struct shardlm_err *e);
/* The usage error for an empty path given to option @opt of @cmd (exit code 2): an empty path
 * names no file, and joined with a name it would name one in /. */
int coord_cli_empty_path(const char *cmd, const char *usage, const char *opt);
/* An option that takes a path: getopt_long's code for it and the name its errors give. (The
 * engine options' -m and --keys are checked by coord_cli_engine_option, for every command.) */
struct coord_cli_path {
    int code;
    const char *name;
};
/* A command's options as getopt_long takes them, its usage text and which options take a path. */
struct coord_cli_cmd {
    const char *name;  /* after "shardlm " in its messages: "generate", "bench tokenizer" */
    const char *usage; /* --help's text, and the usage after a usage error */
    const char *shortopts;
    const struct option *longopts;
    const struct coord_cli_path *paths; /* ended by {0}; NULL: none */
};
/* What coord_cli_getopt returns when the command is to end with the exit code it set. */
#define COORD_CLI_EXIT (-2)
/* The next option of @argv for @cmd (getopt_long; its value in optarg) after what every command
 * does alike: --help (code 'h') prints the usage on stdout; an unknown option or a missing value
 * (getopt's message printed) the usage on stderr, exit 2 (with a @cmd->shortopts starting with
 * ':' the command says it: '?' and ':' are returned); a path option given "" is the usage error
 * of coord_cli_empty_path (exit 2). Returns the option's code, -1 after the last, or
 * COORD_CLI_EXIT with *@exit_code set (0 after --help). */
int coord_cli_getopt(const struct coord_cli_cmd *cmd, int argc, char **argv, int *exit_code);
/* The options of an engine command: each from coord_cli_getopt through the engine's options
 * (with @so, the scheduler's too), else @own(c, @arg) (NULL: none), which returns -1 to go on
 * or the exit code; then no argument may be left. Returns -1 when the command is to run, else its
 * exit code (2 after a bad value, with the usage). */
int coord_cli_parse_engine(const struct coord_cli_cmd *cmd, int argc, char **argv,
                           struct coord_engine_opts *eo, struct coord_sched_opts *so,
                           int (*own)(int c, void *arg), void *arg);
/* The usage error of --kv-tokens and --kv-mem given together (exit code 2), or -1 if not. */
int coord_cli_check_kv(const struct coord_cli_cmd *cmd, const struct coord_engine_opts *eo);
/* A word from a fixed set that a command takes (a subcommand, an option's value) and what it
 * stands for (>= 0). */
struct coord_cli_word {
    const char *name;
    int value;
};
/* The value of @name in @words (ended by {NULL}), or -1 if it is none of them. */
int coord_cli_word(const struct coord_cli_word *words, const char *name);
/* Strict number parsing: all of @s a plain decimal (digits, an optional '-' and '.'; no exponent,
 * hex, inf or space, as the integer options), within [@lo, @hi]. */
bool coord_cli_parse_float(const char *s, float lo, float hi, float *out);
bool coord_cli_parse_double(const char *s, double lo, double hi, double *out);

/* Set by the SIGINT/SIGTERM handler to the signal's number: the engine's cancel flag. */
extern volatile sig_atomic_t coord_stop_signal;
/* `shardlm --version`'s text ("0.1.0 (commit cb668aa1b2c3)"), set by main(); NULL in tests. */
extern const char *coord_cli_version;
/* Installs SIGINT/SIGTERM handlers that set coord_stop_signal, and ignores SIGPIPE. */
void coord_signals_install(void);

#endif
