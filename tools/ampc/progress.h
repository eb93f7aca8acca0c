/* Training progress on stderr: a bar redrawn in place on a terminal (fitted
 * to its width, read at every redraw), plain lines elsewhere. */
#ifndef AMPC_CLI_PROGRESS_H
#define AMPC_CLI_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int on;         /* 0 with --quiet */
  int tty;        /* stderr is a terminal: redraw in place */
  int drawn;      /* a bar is on the screen (to clear before other output) */
} cli_progress;

void cli_progress_init(cli_progress *p, int quiet);
/* The terminal's width in columns (COLUMNS, else 80, where none can be read). */
int cli_terminal_columns(void);
/* Where epoch `epoch` (1-based, of `epochs`) stands: batch b of nb, the
 * running loss, images/s, the loss scale and the seconds left. */
void cli_progress_update(cli_progress *p, int epoch, int epochs, int64_t b, int64_t nb, double loss, double ips, double scale,
                         double eta);
/* Clears a drawn bar, so that the next line starts at column 0. */
void cli_progress_clear(cli_progress *p);
/* The line cli_progress_update would draw in `cols` columns (for tests and
 * the plain form). */
int cli_progress_format(char *out, size_t len, int cols, int epoch, int epochs, int64_t b, int64_t nb, double loss,
                        double ips, double scale, double eta);

#endif
