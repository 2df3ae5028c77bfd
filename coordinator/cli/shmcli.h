/* coordinator/: `shardlm shm list|purge`. */
#ifndef SHARDLM_COORD_SHMCLI_H
#define SHARDLM_COORD_SHMCLI_H

/* argv starts at "shm". Returns the exit code. */
int coord_cmd_shm(int argc, char **argv);

#endif
