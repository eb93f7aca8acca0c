/* Data-parallel runs of the CLI: `mpirun -np N ampc train|bench ...`. One
 * process per rank; rank 0 alone prints progress and writes metrics,
 * checkpoints and weights; errors name their rank; a rank that cannot go on
 * ends the job (MPI_Abort) instead of leaving the others waiting. */
#ifndef AMPC_CLI_DIST_H
#define AMPC_CLI_DIST_H

#include "ampc/comm.h"
#include "cli.h"

/* Under an MPI launcher: the MPI communicator (MPI_Init). Prints the error
 * and returns -1 where that fails or ampc was built without MPI. A no-op
 * for one process started without a launcher. */
int cli_dist_init(void);
/* MPI_Finalize (after the command, on every rank). */
void cli_dist_finish(void);
ampc_comm *cli_dist_comm(void); /* NULL for one process */
/* The NCCL communicator over cli_dist_comm's ranks, made at the first call
 * (every rank calls it; the error printed and NULL if that fails), freed by
 * cli_dist_finish. */
ampc_comm *cli_dist_nccl(void);
/* The kind of the communicator the amp's collectives use: "nccl" once
 * cli_dist_nccl made it, else cli_dist_comm's. */
const char *cli_dist_amp_kind(void);
int cli_dist_rank(void);
int cli_dist_size(void);
int cli_dist_root(void); /* 1 on rank 0 (and for one process) */
/* Threads a rank takes unless --threads or OMP_NUM_THREADS says: this
 * machine's cores over the ranks on it (no oversubscription); 0 for one
 * process (all the cores, as before). */
int cli_dist_default_threads(void);

/* How cli_error prints with several ranks. ALL (the default): every rank,
 * "ampc: error: rank R: ...". ROOT: rank 0 only, without a rank (usage
 * errors, and decisions every rank takes alike). HOLD: kept until
 * cli_dist_agree, which prints the lowest failing rank's. */
typedef enum { CLI_ERRORS_ALL, CLI_ERRORS_ROOT, CLI_ERRORS_HOLD } cli_error_mode;
void cli_dist_error_mode(cli_error_mode m);
/* Where cli_error's line goes: 1 if it is printed now (and how: *prefix
 * gets "rank R: " or ""), 0 if kept or dropped. Kept lines go to held. */
int cli_dist_error_route(const char **prefix, const char *line);
/* Every rank says whether it is fine; returns 1 if all are. If not, the
 * held errors of the lowest failing rank are printed (once), the others'
 * dropped. Leaves the mode at ALL. */
int cli_dist_agree(int ok);
/* After a rank's own error (printed): ends every rank of the job with
 * status code. Returns only for one process. */
void cli_dist_abort(int code);

/* Every rank has parsed its command line (pr: 0, 1 for --help, < 0 an
 * error, which rank 0 alone printed, in ROOT mode). Returns pr where every
 * rank got the same; where they did not (started with different command
 * lines), -1 with one error from rank 0. */
int cli_dist_parse_agree(int pr);
/* Whether every rank parsed the same values for opts (a table ending with a
 * NULL name), leaving out what may differ between hosts -- FILE and DIR
 * options, --threads, --quiet; if not, an error (through cli_error) naming
 * the first option that differs. */
int cli_dist_same_options(const cli_opt *opts);
/* Whether the n values are the same on every rank; if not, an error
 * naming the first that differs (names[i]) with its smallest and largest
 * value over the ranks. */
int cli_dist_same_values(const double *v, const char *const *names, int n);
/* A 64-bit hash of n bytes into h (start from CLI_HASH_START), 8 at a time:
 * what the ranks compare of their options, data and models -- it need only
 * tell copies apart, quickly */
#define CLI_HASH_START 14695981039346656037ull
uint64_t cli_hash_bytes(uint64_t h, const void *p, size_t n);

#endif
