/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench.h: `shardlm bench`: micro-benchmarks of the pieces of a step, run
 * without a model. */
#ifndef SHARDLM_COORD_BENCH_H
#define SHARDLM_COORD_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* `shardlm bench ...`: @argv[0] is "bench". Runs the benchmark @argv[1] names (a row of
 * cmd_bench.c's bench_kinds: allreduce, kernels, tokenizer, sampler), else the model benchmark. Returns the exit code. */
int coord_cmd_bench(int argc, char **argv);

/* `shardlm bench allreduce [--ranks R[,R...]] [--floats N[,N...]] [-r REPS] [--iters K]`:
 * @argv[0] is "allreduce". For each (ranks, floats) forks that many processes over a shared
 * anonymous mapping and prints one line
 *   allreduce ranks=<R> floats=<N> bytes=<4N> median_us=<x> min_us=<y> p90_us=<z> reps=<r>
 * to stdout. Returns the exit code: 0, 1 on a failure (one line on stderr), 2 on bad usage
 * (one line and the usage on stderr); --help prints the usage to stdout and returns 0. */
int coord_bench_allreduce(int argc, char **argv);

/* `shardlm bench -m MODEL [-p N] [-n N] [-t T,...] [-r REPS] [--workers W] [--json]`: @argv[0]
 * is "bench". Prefill and decode through the engine in llama-bench's table, decode bytes per
 * token, the measured read bandwidth and decode's share of it. Returns the exit code. */
int coord_bench_model(int argc, char **argv);

/* `shardlm bench kernels [--isa NAME] [-r REPS] [--json]`: @argv[0] is "kernels". Each matrix
 * kernel on one thread: GEMV GB/s, GEMM GOP/s, then the thread's read bandwidth. */
int coord_bench_kernels(int argc, char **argv);

/* `shardlm bench tokenizer --tokenizer FILE [--mb N] [-r REPS]`: @argv[0] is "tokenizer".
 * Encodes about N MB of coord_bench_text() in one call, REPS times, and prints one line
 *   tokenizer <file> bytes=<n> tokens=<n> mb_per_s=<median> reps=<r>
 * Returns the exit code: 0, 1 on a failure, 2 on bad usage; --help prints the usage. */
int coord_bench_tokenizer(int argc, char **argv);
/* `shardlm bench grammar --tokenizer FILE --data DIR [--json] [--limit N] [--timeout S] [-v]`:
 * the grammar engine over MaskBench's data (see its usage). Returns the exit code. */
int coord_bench_grammar(int argc, char **argv);
/* `shardlm bench sampler`: what sampling a token costs per sequence and step. */
int coord_bench_sampler(int argc, char **argv);

/* Fills @buf with @n bytes of English text (ASCII: varied sentences in paragraphs, the same
 * every time) and a NUL after them (@n + 1 bytes in all). */
void coord_bench_text(char *buf, size_t n);

/* A standard normal deviate (xorshift64*, Box-Muller) from the state @s (nonzero), which it
 * advances: the same sequence for the same seed. */
float coord_bench_normal(uint64_t *s);

/* Median over @reps (<= 16) passes of the read bandwidth in GB/s of @n_threads threads (pinned
 * to @cpus when not NULL), each summing its slice of 1 GiB of arrays in 4 streams; 0 when the
 * memory cannot be had. */
double coord_read_bandwidth(int n_threads, const int *cpus, int reps);

/* `shardlm bench quant [-t THREADS] [-r REPS]`: @argv[0] is "quant". The W4 quantizers' search
 * on normal weights, one line per scheme
 *   quant <scheme> group=<g> rows=<r> cols=<c> threads=<t> us_per_group=<x> reps=<n>
 * Returns the exit code: 0, 1 on a failure, 2 on bad usage; --help prints the usage. */
int coord_bench_quant(int argc, char **argv);

/* `shardlm bench experts -m MODEL.shlm [-n TOKENS] [--ranks R,...] [--batch B,...]`: @argv[0]
 * is "experts". A mixture of experts' routing of TOKENS ids (run here) and Zipf routings, each
 * simulated over the two placements of the experts, one line per (source, ranks, batch):
 *   experts source=<s> ranks=<R> batch=<B> distinct=<d> tp_mb=<x> ep_mb=<y> ep_over_tp=<r>
 * Returns the exit code: 0, 1 on a failure, 2 on bad usage; --help prints the usage. */
int coord_bench_experts(int argc, char **argv);

#endif
