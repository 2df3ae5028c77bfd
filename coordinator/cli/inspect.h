/* coordinator/: `shardlm inspect`. */
#ifndef SHARDLM_COORD_INSPECT_H
#define SHARDLM_COORD_INSPECT_H

/* argv[0] is "inspect". Returns the exit code. */
int coord_cmd_inspect(int argc, char **argv);

#endif
