/* Internal helpers for setting errors and checking invariants. */
#ifndef AMPC_CORE_STATUS_INTERNAL_H
#define AMPC_CORE_STATUS_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>

#include "ampc/status.h"

/* Sets this thread's error message (printf-style) and returns code, so that
 * callers can write `return ampc__error(AMPC_EINVAL, "...", ...);`. */
ampc_status ampc__error(ampc_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to the current message, keeps code; returns code. */
ampc_status ampc__error_prefix(ampc_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Makes m one line: control characters (a newline or an escape quoted from
 * a file or a flag) become '?'. Every message is passed through it; the CLI's
 * own error lines too. */
void ampc__one_line(char *m);

/* Internal invariant: a violated one is a bug in libampc, not bad input. */
#define AMPC_ASSERT(cond)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "ampc: internal error at %s:%d: assertion `%s` failed\n", \
              __FILE__, __LINE__, #cond);                                        \
      abort();                                                                   \
    }                                                                            \
  } while (0)

/* Propagate a failing status. */
#define AMPC_TRY(expr)             \
  do {                             \
    ampc_status ampc__s = (expr);  \
    if (ampc__s < 0) return ampc__s; \
  } while (0)

#endif
