/* SPDX-License-Identifier: MIT */
/* coordinator/cli/main.c: `shardlm` - the command table, the environment checks, dispatch. */
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_main[] =
    "usage: shardlm <command> [options]\n"
    "       shardlm --help | --version\n"
    "\n"
    "shardlm serves decoder-only language models on CPU servers from 4-bit weights: a\n"
    "coordinator process and worker processes that share the weights in shared memory.\n"
    "\n"
    "commands:\n"
    "  convert   INPUT [--scheme S] -o OUT.shlm a GGUF file, Hugging Face directory or llama2.c\n"
    "            checkpoint (+ --tokenizer) into a .shlm model file\n"
    "  synth     --shape NAME -o FILE.gguf      a synthetic model for benchmarks\n"
    "  inspect   FILE                           config, tokenizer and tensors of a model file\n"
    "  tokenize  --tokenizer FILE TEXT          token ids of TEXT (--decode ID... for text)\n"
    "  generate  -m MODEL.shlm -p PROMPT -n N    generate text (streamed to stdout)\n"
    "  serve     -m MODEL.shlm [--port 8080]     an OpenAI-compatible HTTP server\n"
    "  template  --chat-template FILE < REQ.json  the prompt a chat template renders\n"
    "  load      -m MODEL.shlm [--stats]         build (or find) the weights segments and stop:\n"
    "            the next generate starts warm\n"
    "  shm       list | purge | verify          the segments in the runtime directory\n"
    "  keygen    -o DIR                         CURVE keys for --listen off loopback\n"
    "  eval      -m MODEL.shlm --ref DIR         KL divergence, top-1 and perplexity against\n"
    "            reference logits\n"
    "  bench     -m MODEL.shlm [-p 512] [-n 128] [-t 1,2]  prefill and decode speed, roofline\n"
    "  bench allreduce [--ranks 2,4] [--floats N]  latency of the shared-memory all-reduce\n"
    "  bench kernels [--isa NAME]  GEMV GB/s and GEMM GOP/s of each kernel, read bandwidth\n"
    "  bench tokenizer --tokenizer FILE [--mb N]  tokenizing speed (MB/s) on N MB of English\n"
    "  bench sampler [--vocab V] [--seqs S]  sampling cost per step of S sequences\n"
    "  bench quant [-t THREADS]  the W4 quantizer's time per group, w4a8 and w4a16\n"
    "  bench experts -m MODEL.shlm  a mixture of experts' two placements over R ranks,\n"
    "            simulated from its routing: the busiest rank's expert bytes per step\n"
    "  bench grammar --tokenizer FILE --data DIR  the grammar engine over MaskBench's schemas:\n"
    "            passing, errors, mask and compile times\n"
    "\n"
    "`shardlm <command> --help` describes each command's options; `shardlm --version` prints\n"
    "the version and the git commit of the build.\n"
    "\n"
    "environment: SHARDLM_ISA=ref|avx2|avx512|amx forces the workers' kernel table (one this CPU\n"
    "cannot run is an error); SHARDLM_RUNTIME_DIR holds segments and sockets (default\n"
    "/dev/shm/shardlm-<uid>); SHARDLM_WORKER is the worker binary (default: next to shardlm, else\n"
    "../libexec/shardlm/shardlm-worker from shardlm's folder, where an install puts it);\n"
    "SHARDLM_SHM_LIMIT=BYTES refuses segments past that size with ENOSPC (for tests);\n"
    "SHARDLM_PREFETCH=auto|hw|l1|l2 sets the decode GEMVs' software prefetch (default auto:\n"
    "each worker thread times the modes once its first pass over the weights is done and keeps\n"
    "the fastest); SHARDLM_EXPERTS=tp|ep places a mixture of experts' experts over the workers\n"
    "(tp, the default: every worker its share of every expert; ep: each worker whole experts).\n";

/* "0.1.0 (commit cb668aa1b2c3)": generated at build time by cmake/version.cmake */
extern const char coord_version[];

/* Each command, by the name that follows `shardlm`. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"convert", coord_cmd_convert},   {"synth", coord_cmd_synth},
    {"inspect", coord_cmd_inspect},   {"tokenize", coord_cmd_tokenize},
    {"generate", coord_cmd_generate}, {"load", coord_cmd_load},
    {"shm", coord_cmd_shm},           {"keygen", coord_cmd_keygen},
    {"eval", coord_cmd_eval},         {"bench", coord_cmd_bench},
    {"serve", coord_cmd_serve},       {"template", coord_cmd_template},
};

/* The words that ask for the help or the version instead of a command. */
enum { MAIN_HELP, MAIN_VERSION };
static const struct coord_cli_word main_words[] = {{"--help", MAIN_HELP},
                                                   {"-h", MAIN_HELP},
                                                   {"help", MAIN_HELP},
                                                   {"--version", MAIN_VERSION},
                                                   {"-V", MAIN_VERSION},
                                                   {"version", MAIN_VERSION},
                                                   {NULL, 0}};

/* The environment variables --help documents, checked before any command runs: one set wrong
 * (empty, or not a number) is an error, never silently the default. Returns 0 or exit code 2. */
static int check_environment(void)
{
    const char *rd = getenv("SHARDLM_RUNTIME_DIR"), *lim = getenv("SHARDLM_SHM_LIMIT");
    long v;
    if (rd && !*rd) {
        fprintf(stderr, "shardlm: SHARDLM_RUNTIME_DIR is set but empty: unset it for the default "
                        "(/dev/shm/shardlm-<uid>) or name a folder\n");
        return 2;
    }
    if (lim && !coord_parse_long(lim, 1, LONG_MAX, &v)) {
        fprintf(stderr, "shardlm: SHARDLM_SHM_LIMIT='%s': expected a byte count >= 1\n", lim);
        return 2;
    }
    if (rd && strlen(rd) >= PATH_MAX) {
        fprintf(stderr, "shardlm: SHARDLM_RUNTIME_DIR is longer than %d bytes\n", PATH_MAX - 1);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    coord_cli_version = coord_version;
    switch (coord_cli_word(main_words, cmd)) {
    case MAIN_HELP:
        fputs(usage_main, stdout);
        return 0;
    case MAIN_VERSION:
        printf("shardlm %s\n", coord_version);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (strcmp(cmd, commands[i].name))
            continue;
        int env_rc = check_environment();
        /* each command sees argv starting at its own name */
        return env_rc ? env_rc : commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "shardlm: unknown command '%s'\n%s", cmd, usage_main);
    return 2;
}
