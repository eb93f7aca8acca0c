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

/* 1 if path names a file that a run writing checkpoints into dir makes
 * there itself -- a checkpoint, the temporary file of one, the lock -- so
 * that another output of the run must not be it. */
int cli_ckptdir_owns(const char *dir, const char *path);

/* Whether a run that resumed from resume ("" for a new run) may write its
 * checkpoints into dir: dir holds none, or its newest is resume itself (the
 * run goes on where it stopped). 0 otherwise, with dir's newest in latest
 * (len long): the run's saves would mix with another run's, or replace the
 * later checkpoints of the run it branches from. */
int cli_ckptdir_fits(const char *dir, const char *resume, char *latest, size_t len);

/* The folder for a SIGINT/SIGTERM save of a run without --checkpoint-dir:
 * "checkpoints" where cli_ckptdir_fits, else the first of "checkpoints.1",
 * "checkpoints.2", ... that does; locked as cli_ckptdir_lock does. Its name
 * goes to out (len long); -1 after one error where none can be had. */
int cli_ckptdir_default(const char *resume, char *out, size_t len);

#endif
