/* coordinator/: `shardlm synth` (synthetic GGUF models for benchmarks and tests). */
#ifndef SHARDLM_COORD_SYNTH_H
#define SHARDLM_COORD_SYNTH_H

/* argv[0] is "synth". Returns the exit code. */
int coord_cmd_synth(int argc, char **argv);

#endif
