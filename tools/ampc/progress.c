/* The progress bar and its plain form. */
#include "progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

void cli_progress_init(cli_progress *p, int quiet) {
  memset(p, 0, sizeof *p);
  p->on = !quiet;
  p->tty = p->on && isatty(fileno(stderr));
}

int cli_terminal_columns(void) {
  struct winsize ws;
  if (ioctl(fileno(stderr), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char *c = getenv("COLUMNS");
  int n = c ? atoi(c) : 0;
  return n > 0 && n < 10000 ? n : 80;
}

/* "1h02m", "3m05s", "42s" */
static void fmt_eta(char *out, size_t len, double s) {
  if (!(s >= 0) || s > 359999) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(out, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) snprintf(out, len, "%ldm%02lds", t / 60, t % 60);
  else snprintf(out, len, "%lds", t);
}

int cli_progress_format(char *out, size_t len, int cols, int epoch, int epochs, int64_t b, int64_t nb, double loss,
                        double ips, double scale, double eta) {
  char e[48], head[48], tail[320];
  fmt_eta(e, sizeof e, eta);
  snprintf(head, sizeof head, "epoch %d/%d ", epoch, epochs);
  /* the parts after the bar, dropped from the end of this list until the line fits */
  const int nparts = 5;
  char parts[5][64];
  snprintf(parts[0], sizeof parts[0], " %lld/%lld", (long long)b, (long long)nb);
  snprintf(parts[1], sizeof parts[1], " loss %.4f", loss);
  snprintf(parts[2], sizeof parts[2], " %.0f img/s", ips);
  snprintf(parts[3], sizeof parts[3], " ETA %s", e);
  snprintf(parts[4], sizeof parts[4], " scale %g", scale);
  static const int keep_order[5] = {0, 1, 3, 2, 4}; /* least worth keeping last */
  int width = cols - 1; /* the last column stays empty: no wrap */
  for (int kept = nparts; kept >= 0; kept--) {
    int use[5] = {0};
    for (int i = 0; i < kept; i++) use[keep_order[i]] = 1;
    size_t o = 0;
    tail[0] = '\0';
    for (int i = 0; i < nparts; i++)
      if (use[i]) o += (size_t)snprintf(tail + o, sizeof tail - o, "%s", parts[i]);
    int bar = width - (int)strlen(head) - 2 - (int)o;
    if (bar > 30) bar = 30;
    if (bar >= 8 || kept == 0) {
      if (bar < 0) bar = 0;
      int filled = nb > 0 ? (int)((int64_t)bar * b / nb) : bar;
      char barbuf[32];
      for (int i = 0; i < bar; i++) barbuf[i] = i < filled ? '#' : '.';
      barbuf[bar] = '\0';
      int n = snprintf(out, len, "%s[%s]%s", head, barbuf, tail);
      if (n > width && width > 0 && (size_t)width < len) {
        out[width] = '\0';
        n = width;
      }
      return n;
    }
  }
  return 0;
}

void cli_progress_update(cli_progress *p, int epoch, int epochs, int64_t b, int64_t nb, double loss, double ips, double scale,
                         double eta) {
  if (!p->on) return;
  char line[512];
  if (p->tty) {
    cli_progress_format(line, sizeof line, cli_terminal_columns(), epoch, epochs, b, nb, loss, ips, scale, eta);
    fprintf(stderr, "\r%s\033[K", line); /* redrawn in place, the rest of the row cleared */
    p->drawn = 1;
  } else {
    cli_progress_format(line, sizeof line, 200, epoch, epochs, b, nb, loss, ips, scale, eta);
    fprintf(stderr, "%s\n", line);
  }
  fflush(stderr);
}

void cli_progress_clear(cli_progress *p) {
  if (!p->drawn) return;
  fprintf(stderr, "\r\033[K");
  fflush(stderr);
  p->drawn = 0;
}
