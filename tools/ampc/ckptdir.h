/* Checkpoint folders: the lock that makes one run their only writer, the
 * cleanup of interrupted saves, and the list of complete checkpoints. */
#ifndef AMPC_CLI_CKPTDIR_H
#define AMPC_CLI_CKPTDIR_H

#include <stddef.h>

/* Makes dir and the folders above it that are missing (mkdir -p): 0, or -1
 * with errno set. */
int cli_mkdirs(const char *dir);

/* Makes dir if needed (and its missing parents), checks that files can be created in it,
 * takes an exclusive lock on dir/.lock (with this process's pid in it) for the
 * rest of the process's life, and removes the temporary files that a killed
 * save left there. Returns the lock's descriptor, or prints one error (for
 * flag, naming the holder's pid when another run has the folder) and returns
 * -1. A note about removed files goes to stderr. */
int cli_ckptdir_lock(const char *flag, const char *dir);

/* A run that failed before writing anything into the folder it locked:
 * removes the lock file, when that run made it, and the folders that
 * cli_ckptdir_lock made for it, so that a typo'd path leaves nothing behind.
 * Nothing happens where the folder holds anything else. */
void cli_ckptdir_abandon(void);

/* 1 (and its step) if name is a checkpoint file's name: ckpt-step-N.safetensors. */
int cli_checkpoint_step(const char *name, long long *step);
/* dir/ckpt-step-<step, 8 digits>.safetensors */
void cli_checkpoint_path(char *out, size_t len, const char *dir, long long step);
/* The complete checkpoint (a regular file of that name) of the highest step in dir; 0 if found. */
int cli_latest_checkpoint(const char *dir, char *out, size_t len);
/* Removes all but the newest `keep` complete checkpoints in dir. */
void cli_prune_checkpoints(const char *dir, int keep);

#endif
