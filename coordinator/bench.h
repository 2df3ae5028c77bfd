/* coordinator/: `shardlm bench`: micro-benchmarks of the pieces of a step, run without a model. */
#ifndef SHARDLM_COORD_BENCH_H
#define SHARDLM_COORD_BENCH_H

/* `shardlm bench allreduce [--ranks R[,R...]] [--floats N[,N...]] [-r REPS] [--iters K]`:
 * @argv[0] is "allreduce". For each (ranks, floats) forks that many processes over a shared
 * anonymous mapping and prints one line
 *   allreduce ranks=<R> floats=<N> bytes=<4N> median_us=<x> min_us=<y> p90_us=<z> reps=<r>
 * to stdout. Returns the exit code: 0, 1 on a failure (one line on stderr), 2 on bad usage
 * (one line and the usage on stderr); --help prints the usage to stdout and returns 0. */
int coord_bench_allreduce(int argc, char **argv);

#endif
