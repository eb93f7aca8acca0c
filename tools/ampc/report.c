/* ampc report: the metrics of one or more runs (`ampc train --metrics`) as one
 * self-contained HTML page of SVG charts.
 *
 * Input: JSON Lines. An object with "epoch" is an epoch record (train_loss,
 * test_loss, test_acc, images_per_s, lr, steps, loss_scale, skipped_steps,
 * memory, grad_underflow_fraction, ...); one with "step" and no "epoch" is a
 * step record (loss, loss_scale, skipped, lr, grad_norm). Other objects are
 * passed over. A resumed run appends to its file, so an epoch or step that
 * appears twice counts with its last record.
 *
 * Output: every chart is inline SVG (no scripts, fonts or network). The data
 * drawn travel with the page: each line carries data-x / data-y (the values,
 * printed so that they read back to the same doubles), each memory bar
 * data-bytes, and one <script type="application/json" id="ampc-report-data">
 * block holds every run's records as read (their lines, verbatim). Series
 * longer than a screen can show are drawn thinned (thin()).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampc/version.h"
#include "cli.h"
#include "io/fsutil_internal.h"

/* ---- growing buffers ----------------------------------------------------- */

typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_grow(sbuf *b, size_t more) {
  if (b->oom || b->n + more + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 1 << 16;
  while (cap < b->n + more + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return;
  }
  b->p = p;
  b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t len) {
  sb_grow(b, len);
  if (b->oom) return;
  memcpy(b->p + b->n, s, len);
  b->n += len;
  b->p[b->n] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (len < 0) return;
  sb_grow(b, (size_t)len);
  if (b->oom) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, (size_t)len + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)len;
}

/* The character reference that stands for c in HTML text or an attribute
 * value, or NULL where c stands for itself. */
static const char *html_entity(char c) {
  switch (c) {
    case '&': return "&amp;";
    case '<': return "&lt;";
    case '>': return "&gt;";
    case '"': return "&quot;";
    case '\'': return "&#39;";
    default: return NULL;
  }
}

/* The length of the UTF-8 character at s (1 to 4 bytes), or 0 where its
 * bytes are not one (a file name or --title may be any bytes). */
static int utf8_char(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  int n = u[0] < 0x80 ? 1 : u[0] >= 0xC2 && u[0] <= 0xDF ? 2 : u[0] >= 0xE0 && u[0] <= 0xEF ? 3 : u[0] >= 0xF0 && u[0] <= 0xF4 ? 4 : 0;
  for (int i = 1; i < n; i++) /* (a NUL ends the loop: it is no continuation byte) */
    if ((u[i] & 0xC0) != 0x80) return 0;
  /* overlong forms, UTF-16 surrogates, past U+10FFFF */
  if ((u[0] == 0xE0 && u[1] < 0xA0) || (u[0] == 0xED && u[1] >= 0xA0) || (u[0] == 0xF0 && u[1] < 0x90) || (u[0] == 0xF4 && u[1] >= 0x90))
    return 0;
  return n;
}

/* The character at s into b, or U+FFFD where its byte is not UTF-8; the
 * bytes of s it stood for. */
static size_t sb_utf8(sbuf *b, const char *s) {
  int n = utf8_char(s);
  sb_put(b, n ? s : "\xEF\xBF\xBD", n ? (size_t)n : 3);
  return n ? (size_t)n : 1;
}

/* Text or an attribute value, escaped for HTML; a byte that is not UTF-8
 * written as U+FFFD (the page says it is UTF-8). */
static void sb_esc(sbuf *b, const char *s) {
  while (*s) {
    const char *r = html_entity(*s);
    if (r) sb_puts(b, r), s++;
    else s += sb_utf8(b, s);
  }
}

/* A copy of s, each byte that is not UTF-8 replaced with U+FFFD, for a JSON
 * string (NULL: out of memory). */
static char *utf8_copy(const char *s) {
  sbuf t = {0};
  sb_put(&t, "", 0); /* (an empty s is still a string) */
  while (*s) s += sb_utf8(&t, s);
  if (t.oom) free(t.p);
  return t.oom ? NULL : t.p;
}

/* s into buf (n bytes), cut short at a whole character: UTF-8 in, UTF-8 out. */
static void copy_cut(char *buf, size_t n, const char *s) {
  size_t k = 0;
  while (*s) {
    size_t len = utf8_char(s) ? (size_t)utf8_char(s) : 1;
    if (k + len >= n) break;
    memcpy(buf + k, s, len);
    k += len;
    s += len;
  }
  buf[k] = '\0';
}

/* sb_esc's escaping into buf (n bytes; cut short at a whole character or
 * character reference), for a name from the file inside a formatted line. */
static const char *html(char *buf, size_t n, const char *s) {
  size_t k = 0;
  for (int c; *s; s += c) {
    const char *r = html_entity(*s);
    c = r || !utf8_char(s) ? 1 : utf8_char(s);
    size_t len = r ? strlen(r) : (size_t)c;
    if (k + len >= n) break;
    memcpy(buf + k, r ? r : s, len);
    k += len;
  }
  buf[k] = '\0';
  return buf;
}

/* The shortest %g form that reads back as the same double. */
static const char *num(char buf[40], double v) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, 40, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  return buf;
}

typedef struct {
  double *v;
  size_t n, cap;
} dvec;

static int dv_push(dvec *d, double x) {
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 64;
    double *v = realloc(d->v, cap * sizeof *v);
    if (!v) return -1;
    d->v = v;
    d->cap = cap;
  }
  d->v[d->n++] = x;
  return 0;
}

/* ---- reading the metrics ----------------------------------------------- */

typedef struct {
  int64_t epoch, steps, skipped; /* steps, skipped: -1 when absent */
  double train_loss, test_loss, test_acc, ips, seconds, lr, loss_scale, underflow;
  int train_nonfinite, test_nonfinite; /* the loss is there, null: not finite (a NaN or inf the file could not hold) */
  size_t order; /* position in the file: the later of two records of an epoch wins */
  json_t *memory;
} epoch_rec;

typedef struct {
  int64_t step;
  double loss, loss_scale, lr, grad_norm;
  int skipped, loss_nonfinite;
  size_t order;
} step_rec;

typedef struct {
  const char *path;
  char opt_level[16], half[16];
  epoch_rec *ep;
  size_t nep;
  step_rec *st;
  size_t nst;
  sbuf records; /* every epoch and step record kept as read, their lines joined by commas, for the page's data block */
} run_t;

typedef struct {
  const char *path;
  long line;
} where;

/* The number under key into *out (NAN when absent or null); -1 with the
 * error printed when it is there but not a number. */
static int get_num(json_t *o, const char *key, double *out, where w) {
  json_t *v = json_object_get(o, key);
  *out = NAN;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) {
    cli_error("%s:%ld: \"%s\" is not a number", w.path, w.line, key);
    return -1;
  }
  *out = json_number_value(v);
  return 0;
}

/* An integer (>= min) under key into *out (-1 when absent and !required). */
static int get_int(json_t *o, const char *key, int64_t *out, int64_t min, int required, where w) {
  json_t *v = json_object_get(o, key);
  *out = -1;
  if (!v && !required) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < min) {
    cli_error("%s:%ld: \"%s\" is not an integer of at least %lld", w.path, w.line, key, (long long)min);
    return -1;
  }
  *out = (int64_t)json_integer_value(v);
  return 0;
}

/* A byte count of the memory breakdown ("memory.CATEGORY.KEY", or
 * "memory.KEY" where cat is NULL) into *out; -1 with the error printed when
 * it is absent or not an integer of at least 0. */
static int get_bytes(json_t *v, const char *cat, const char *key, int64_t *out, where w) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    cli_error("%s:%ld: \"memory.%s%s%s\" is not an integer of at least 0", w.path, w.line, cat ? cat : "", cat ? "." : "", key);
    return -1;
  }
  *out = (int64_t)json_integer_value(v);
  return 0;
}

/* The memory breakdown as cli_memory_json() writes it: {category: {dtype:
 * bytes, ..., "total": bytes}, ..., "total": bytes}, each total the sum of
 * what it holds. The bars are drawn to scale against the largest category
 * total, so every count must be an integer of at least 0, each category must
 * have its "total" and no type more than it, and the categories no more than
 * the record's "total" where it has one (a negative count made a bar of
 * negative width, a type past its total one far wider than the chart). */
static int check_memory(json_t *mem, where w) {
  int64_t sum = 0, grand;
  int over = 0; /* the categories' totals add up past INT64_MAX */
  const char *cat;
  json_t *c;
  json_object_foreach(mem, cat, c) {
    if (strcmp(cat, "total") == 0) continue;
    if (!json_is_object(c)) {
      cli_error("%s:%ld: \"memory.%s\" is not an object", w.path, w.line, cat);
      return -1;
    }
    int64_t total, parts = 0, bytes;
    if (get_bytes(json_object_get(c, "total"), cat, "total", &total, w) < 0) return -1;
    const char *dt;
    json_t *v;
    json_object_foreach(c, dt, v) {
      if (strcmp(dt, "total") == 0) continue;
      if (get_bytes(v, cat, dt, &bytes, w) < 0) return -1;
      if (bytes > total) {
        cli_error("%s:%ld: \"memory.%s.%s\" (%lld bytes) is more than the category's \"total\" (%lld)", w.path, w.line, cat, dt,
                  (long long)bytes, (long long)total);
        return -1;
      }
      if (bytes > total - parts) { /* (parts <= total: no overflow) */
        cli_error("%s:%ld: the types of \"memory.%s\" add up to more than its \"total\" (%lld bytes)", w.path, w.line, cat,
                  (long long)total);
        return -1;
      }
      parts += bytes;
    }
    if (total > INT64_MAX - sum) over = 1;
    else sum += total;
  }
  json_t *g = json_object_get(mem, "total");
  if (g && get_bytes(g, NULL, "total", &grand, w) < 0) return -1;
  if (g && (over || sum > grand)) {
    cli_error("%s:%ld: the categories of \"memory\" add up to more than its \"total\" (%lld bytes)", w.path, w.line, (long long)grand);
    return -1;
  }
  return 0;
}

static int read_epoch(run_t *r, json_t *o, where w, size_t order) {
  epoch_rec e = {.order = order};
  if (get_int(o, "epoch", &e.epoch, 0, 1, w) < 0 || get_int(o, "steps", &e.steps, 0, 0, w) < 0 ||
      get_int(o, "skipped_steps", &e.skipped, 0, 0, w) < 0 || get_num(o, "train_loss", &e.train_loss, w) < 0 ||
      get_num(o, "test_loss", &e.test_loss, w) < 0 || get_num(o, "test_acc", &e.test_acc, w) < 0 ||
      get_num(o, "images_per_s", &e.ips, w) < 0 || get_num(o, "seconds", &e.seconds, w) < 0 ||
      get_num(o, "lr", &e.lr, w) < 0 || get_num(o, "loss_scale", &e.loss_scale, w) < 0 ||
      get_num(o, "grad_underflow_fraction", &e.underflow, w) < 0)
    return -1;
  json_t *mem = json_object_get(o, "memory");
  if (mem && !json_is_object(mem)) {
    cli_error("%s:%ld: \"memory\" is not an object", w.path, w.line);
    return -1;
  }
  if (mem && check_memory(mem, w) < 0) return -1;
  e.train_nonfinite = json_is_null(json_object_get(o, "train_loss"));
  e.test_nonfinite = json_is_null(json_object_get(o, "test_loss"));
  const char *lvl = json_string_value(json_object_get(o, "opt_level")), *half = json_string_value(json_object_get(o, "half"));
  if (lvl) copy_cut(r->opt_level, sizeof r->opt_level, lvl);
  if (half) copy_cut(r->half, sizeof r->half, half);
  epoch_rec *ep = realloc(r->ep, (r->nep + 1) * sizeof *ep);
  if (!ep) return -1;
  r->ep = ep;
  e.memory = mem ? json_incref(mem) : NULL;
  r->ep[r->nep++] = e;
  return 0;
}

static int read_step(run_t *r, json_t *o, where w, size_t order) {
  step_rec s = {.order = order};
  if (get_int(o, "step", &s.step, 0, 1, w) < 0 || get_num(o, "loss", &s.loss, w) < 0 ||
      get_num(o, "loss_scale", &s.loss_scale, w) < 0 || get_num(o, "lr", &s.lr, w) < 0 ||
      get_num(o, "grad_norm", &s.grad_norm, w) < 0)
    return -1;
  json_t *sk = json_object_get(o, "skipped");
  if (sk && !json_is_boolean(sk) && !json_is_integer(sk) && !json_is_null(sk)) {
    cli_error("%s:%ld: \"skipped\" is not a boolean", w.path, w.line);
    return -1;
  }
  s.skipped = json_is_true(sk) || (json_is_integer(sk) && json_integer_value(sk) != 0);
  s.loss_nonfinite = json_is_null(json_object_get(o, "loss"));
  step_rec *st = realloc(r->st, (r->nst + 1) * sizeof *st);
  if (!st) return -1;
  r->st = st;
  r->st[r->nst++] = s;
  return 0;
}

static int cmp_epoch(const void *a, const void *b) {
  const epoch_rec *x = a, *y = b;
  if (x->epoch != y->epoch) return x->epoch < y->epoch ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_step(const void *a, const void *b) {
  const step_rec *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* Sorts by epoch (step) and keeps the last record of each. */
static void dedupe(run_t *r) {
  if (r->nep > 1) qsort(r->ep, r->nep, sizeof *r->ep, cmp_epoch);
  size_t k = 0;
  for (size_t i = 0; i < r->nep; i++) {
    if (k && r->ep[k - 1].epoch == r->ep[i].epoch) {
      json_decref(r->ep[k - 1].memory);
      r->ep[k - 1] = r->ep[i];
    } else {
      r->ep[k++] = r->ep[i];
    }
  }
  r->nep = k;
  if (r->nst > 1) qsort(r->st, r->nst, sizeof *r->st, cmp_step);
  k = 0;
  for (size_t i = 0; i < r->nst; i++) {
    if (k && r->st[k - 1].step == r->st[i].step) r->st[k - 1] = r->st[i];
    else r->st[k++] = r->st[i];
  }
  r->nst = k;
}

static int read_run(run_t *r, const char *path) {
  memset(r, 0, sizeof *r);
  r->path = path;
  FILE *f = cli_open_read(NULL, path);
  if (!f) return -1;
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  long lineno = 0;
  int rc = 0;
  errno = 0;
  while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    where w = {path, lineno};
    size_t i = 0;
    while (i < (size_t)len && line[i] && strchr(" \t\r\n", line[i])) i++; /* (a NUL is not blank: strchr finds the terminator) */
    if (i == (size_t)len) continue; /* blank line */
    if (memchr(line, '\0', (size_t)len)) {
      cli_error("%s:%ld: not text (a NUL byte)", path, lineno);
      rc = -1;
      break;
    }
    json_error_t je;
    json_t *o = json_loadb(line, (size_t)len, 0, &je);
    if (!o) {
      if (je.column > 0) cli_error("%s:%ld: malformed JSON: %s (column %d)", path, lineno, je.text, je.column);
      else cli_error("%s:%ld: malformed JSON: %s", path, lineno, je.text);
      rc = -1;
      break;
    }
    if (!json_is_object(o)) {
      cli_error("%s:%ld: not a JSON object", path, lineno);
      rc = -1;
    } else if (json_object_get(o, "epoch") || json_object_get(o, "step")) {
      rc = json_object_get(o, "epoch") ? read_epoch(r, o, w, (size_t)lineno) : read_step(r, o, w, (size_t)lineno);
      /* the line as written (JSON that jansson took whole), without its line end */
      while (len > 0 && strchr(" \t\r\n", line[len - 1])) len--;
      if (rc == 0 && r->records.n) sb_put(&r->records, ",", 1);
      if (rc == 0) sb_put(&r->records, line, (size_t)len);
      if (r->records.oom) {
        cli_error("report: out of memory");
        rc = -1;
      }
    }
    json_decref(o);
  }
  if (rc == 0 && ferror(f)) {
    cli_error("%s: read error: %s", path, strerror(errno));
    rc = -1;
  }
  free(line);
  fclose(f);
  if (rc == 0 && r->nep == 0 && r->nst == 0) {
    cli_error("%s: no records (expected JSON objects with \"epoch\" or \"step\", one a line, as `ampc train --metrics` writes)", path);
    rc = -1;
  }
  if (rc == 0) dedupe(r);
  return rc;
}

static void free_run(run_t *r) {
  for (size_t i = 0; i < r->nep; i++) json_decref(r->ep[i].memory);
  free(r->ep);
  free(r->st);
  free(r->records.p);
}

/* ---- charts ------------------------------------------------------------ */

static const char *const run_colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_COLOURS (sizeof run_colours / sizeof run_colours[0])
/* Runs past the ten: hues a golden angle apart (no two alike however many),
 * at a lightness of 30-54% that reads on white. */
static const char *colour(size_t run) {
  if (run < N_COLOURS) return run_colours[run];
  static char more[64][32];
  static size_t which;
  char *c = more[which++ % 64];
  snprintf(c, sizeof more[0], "hsl(%.0f,70%%,%d%%)", fmod(17.0 + 137.508 * (double)(run - N_COLOURS), 360.0), 30 + (int)(run % 4) * 8);
  return c;
}

typedef struct {
  size_t run;
  const char *key;   /* "train_loss": what the values are, in the page's data */
  const char *label; /* "train" */
  int dashed;
  dvec x, y;
  dvec mx, my, mcount; /* marked points (skipped steps) and how many each stands for */
  dvec breaks;         /* the line breaks before the first point at each of these x: a value was not finite there */
  int gap;             /* a value that was not finite since the last point */
} series;

typedef enum { FMT_PLAIN, FMT_PERCENT } tick_fmt;

typedef struct {
  const char *id, *title, *xlabel, *ylabel, *note;
  int logy;     /* log2 axis: the loss scale */
  int xinteger; /* epochs, steps: integer ticks */
  tick_fmt yfmt;
  series *s;
  size_t ns;
  json_t *data; /* the chart's series, for the page's data block */
} chart;

static series *chart_add(chart *c, size_t run, const char *key, const char *label, int dashed) {
  series *s = realloc(c->s, (c->ns + 1) * sizeof *s);
  if (!s) return NULL;
  c->s = s;
  s = &c->s[c->ns++];
  memset(s, 0, sizeof *s);
  s->run = run;
  s->key = key;
  s->label = label;
  s->dashed = dashed;
  return s;
}

static void chart_free(chart *c) {
  for (size_t i = 0; i < c->ns; i++) {
    free(c->s[i].x.v);
    free(c->s[i].y.v);
    free(c->s[i].mx.v);
    free(c->s[i].my.v);
    free(c->s[i].mcount.v);
    free(c->s[i].breaks.v);
  }
  free(c->s);
}

/* Whether a point can be drawn: x and y finite and within +-PLOT_MAX, so that
 * an axis's span (y1 - y0, its 8% margins) stays finite (two values of 1e308
 * and -1e308 made it inf, and the coordinates NaN); y > 0 on a log axis. */
#define PLOT_MAX 1e300
/* The least span of a linear y axis: below it a division by the span (the
 * coordinates, the tick step) loses its precision or gives inf or NaN (a
 * single value of 5e-324 made an axis from 5e-324 to 5e-324). */
#define PLOT_MIN_SPAN 1e-300
static int drawable(const chart *c, double x, double y) {
  return fabs(x) <= PLOT_MAX && fabs(y) <= PLOT_MAX && !(c->logy && y <= 0);
}

/* Adds a point unless y is missing (or, on a log axis, not positive). */
static int point(chart *c, series *s, double x, double y) {
  if (!s || !drawable(c, x, y)) return 0;
  if (s->gap && s->x.n && dv_push(&s->breaks, x) < 0) return -1;
  s->gap = 0;
  if (dv_push(&s->x, x) < 0) return -1;
  if (dv_push(&s->y, y) < 0) return s->x.n--, -1; /* (x and y stay as long as each other) */
  return 0;
}

/* A value that was not finite (null in the file): the line stops before it
 * and starts again at the next point, rather than joining over it. */
static void gap(series *s) {
  if (s) s->gap = 1;
}

static int mark(chart *c, series *s, double x, double y, double count) {
  if (!s || !drawable(c, x, y)) return 0;
  if (dv_push(&s->mx, x) < 0) return -1;
  if (dv_push(&s->my, y) < 0) return s->mx.n--, -1;
  if (dv_push(&s->mcount, count) < 0) return s->mx.n--, s->my.n--, -1;
  return 0;
}

/* Plot geometry, in SVG user units. */
#define CW 540.0
#define CH 300.0
#define ML 78.0
#define MR 18.0
#define MT 14.0
#define MB 46.0

typedef struct {
  double x0, x1, y0, y1; /* data range (y in log2 units on a log axis) */
  int logy;
} axes;

static double px(const axes *a, double x) { return ML + (x - a->x0) / (a->x1 - a->x0) * (CW - ML - MR); }
/* y in the axis's units (log2 of the value on a log axis) */
static double py_units(const axes *a, double v) { return CH - MB - (v - a->y0) / (a->y1 - a->y0) * (CH - MT - MB); }
static double py(const axes *a, double y) { return py_units(a, a->logy ? log2(y) : y); }

/* Ticks on an axis, at most: the loops count, so a step too small to move a
 * value of that magnitude cannot make them endless. */
#define MAX_TICKS 32

/* 1, 2 or 5 times a power of ten, about range / target. */
static double nice_step(double range, int target) {
  double raw = range / target, p = pow(10.0, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void tick_label(char *buf, size_t len, double v, tick_fmt fmt, double step) {
  if (fabs(v) < step * 1e-9) v = 0;
  if (fmt == FMT_PERCENT) {
    int dec = step * 100 >= 1 ? 0 : step * 100 >= 0.1 ? 1 : 2;
    snprintf(buf, len, "%.*f%%", dec, v * 100);
  } else if (v != 0 && (fabs(v) >= 1e6 || step < 1e-4)) {
    /* 1.015e-03: as many digits as the step needs */
    int digits = (int)floor(log10(fabs(v))) - (int)floor(log10(step));
    snprintf(buf, len, "%.*e", digits < 0 ? 0 : digits > 6 ? 6 : digits, v);
  } else {
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    snprintf(buf, len, "%.*f", dec > 6 ? 6 : dec, v);
  }
}

/* The series' values as one attribute: "1,2,3". */
static void attr_values(sbuf *b, const char *name, const dvec *d) {
  char t[40];
  sb_printf(b, " %s=\"", name);
  for (size_t i = 0; i < d->n; i++) sb_printf(b, "%s%s", i ? "," : "", num(t, d->v[i]));
  sb_puts(b, "\"");
}

static json_t *dv_json(const dvec *d) {
  json_t *a = json_array();
  for (size_t i = 0; i < d->n; i++) json_array_append_new(a, json_real(d->v[i]));
  return a;
}

/* Long series are drawn thinned: the plot's width in THIN_COLUMNS columns,
 * of a series of more than 4 columns' worth of points each column keeps its
 * first, lowest, highest and last (in the series' order: the line's shape,
 * its spikes included, at any zoom a screen shows), and of more than a
 * column's worth of skipped-step marks one a column, standing for their
 * sum. (A million steps drawn whole made a page of hundreds of MB that a
 * browser could hardly open.) The data block keeps every record. */
enum { THIN_COLUMNS = 1000 };

static int64_t thin_column(const axes *a, double x) {
  double f = (x - a->x0) / (a->x1 - a->x0) * THIN_COLUMNS;
  return f < 0 ? 0 : f > THIN_COLUMNS ? THIN_COLUMNS : (int64_t)f;
}

static void thin(series *s, const axes *a) {
  size_t w = 0;
  if (s->x.n > 4 * THIN_COLUMNS) {
    for (size_t g = 0, e; g < s->x.n; g = e) {
      int64_t col = thin_column(a, s->x.v[g]);
      size_t lo = g, hi = g;
      for (e = g + 1; e < s->x.n && thin_column(a, s->x.v[e]) == col; e++) {
        if (s->y.v[e] < s->y.v[lo]) lo = e;
        if (s->y.v[e] > s->y.v[hi]) hi = e;
      }
      size_t keep[4] = {g, lo < hi ? lo : hi, lo < hi ? hi : lo, e - 1};
      for (int k = 0; k < 4; k++) {
        if (k && keep[k] == keep[k - 1]) continue; /* (each index at most once: they are in order) */
        s->x.v[w] = s->x.v[keep[k]]; /* keep[k] >= w: nothing still to be read is overwritten */
        s->y.v[w++] = s->y.v[keep[k]];
      }
    }
    s->x.n = s->y.n = w;
  }
  if (s->mx.n > THIN_COLUMNS) {
    w = 0;
    for (size_t g = 0, e; g < s->mx.n; g = e) {
      int64_t col = thin_column(a, s->mx.v[g]);
      double count = s->mcount.v[g];
      for (e = g + 1; e < s->mx.n && thin_column(a, s->mx.v[e]) == col; e++) count += s->mcount.v[e];
      s->mx.v[w] = s->mx.v[g];
      s->my.v[w] = s->my.v[g];
      s->mcount.v[w++] = count;
    }
    s->mx.n = s->my.n = s->mcount.n = w;
  }
}

static void render_chart(sbuf *b, chart *c, const run_t *runs, size_t nruns, json_t *charts_json) {
  axes a = {INFINITY, -INFINITY, INFINITY, -INFINITY, c->logy};
  size_t points = 0;
  for (size_t i = 0; i < c->ns; i++) {
    const series *s = &c->s[i];
    for (int pass = 0; pass < 2; pass++) {
      const dvec *xs = pass ? &s->mx : &s->x, *ys = pass ? &s->my : &s->y;
      for (size_t k = 0; k < xs->n; k++) {
        double y = c->logy ? log2(ys->v[k]) : ys->v[k];
        a.x0 = fmin(a.x0, xs->v[k]);
        a.x1 = fmax(a.x1, xs->v[k]);
        a.y0 = fmin(a.y0, y);
        a.y1 = fmax(a.y1, y);
        points++;
      }
    }
  }
  if (!points) return; /* nothing of this kind in any run */
  if (a.x1 - a.x0 < 1e-12 * fmax(1.0, fabs(a.x1))) { /* one x: a range around it that its magnitude can hold */
    double h = fmax(1.0, fabs(a.x1) * 1e-6);
    a.x0 -= h;
    a.x1 += h;
  }
  if (c->logy) {
    a.y0 = floor(a.y0) - (a.y1 - a.y0 < 1 ? 1 : 0);
    a.y1 = ceil(a.y1) + (a.y1 - a.y0 < 1 ? 1 : 0);
    if (a.y1 - a.y0 < 2) a.y1 = a.y0 + 2;
  } else {
    double lo = a.y0, span = a.y1 - a.y0;
    if (span <= 1e-9 * fabs(a.y1) || span < PLOT_MIN_SPAN) { /* one value: centre it */
      double h = fabs(a.y1) * 0.5 >= PLOT_MIN_SPAN ? fabs(a.y1) * 0.5 : 1.0;
      a.y0 -= h;
      a.y1 += h;
    } else {
      a.y0 -= span * 0.08;
      a.y1 += span * 0.08;
    }
    if (a.y0 < 0 && lo >= 0) a.y0 = 0; /* values >= 0 keep a floor at 0 */
  }

  for (size_t i = 0; i < c->ns; i++) thin(&c->s[i], &a);

  json_t *cj = json_pack("{s:s, s:s, s:s, s:b, s:[]}", "id", c->id, "title", c->title, "x", c->xlabel, "log_y", c->logy, "series");
  json_t *sj = json_object_get(cj, "series");
  sb_printf(b, "<figure class=\"chart\" id=\"chart-%s\">\n<figcaption>", c->id);
  sb_esc(b, c->title);
  if (c->note) {
    sb_puts(b, " <span class=\"note\">");
    sb_esc(b, c->note);
    sb_puts(b, "</span>");
  }
  sb_printf(b, "</figcaption>\n<svg class=\"plot\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" role=\"img\" aria-label=\"", CW, CH, CW, CH);
  sb_esc(b, c->title);
  sb_printf(b, "\" data-chart=\"%s\">\n", c->id);
  sb_printf(b, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", ML, MT, CW - ML - MR, CH - MT - MB);

  /* y grid and labels */
  char lab[64];
  if (c->logy) {
    int step = (int)ceil((a.y1 - a.y0) / 6.0);
    if (step < 1) step = 1;
    for (double e = ceil(a.y0); e <= a.y1 + 1e-9 && e - ceil(a.y0) < MAX_TICKS * step; e += step) {
      double y = py_units(&a, e); /* (not py(exp2(e)): below 2^-1074 exp2 gives 0, whose log2 is -inf) */
      if (e >= -7 && e <= 24) snprintf(lab, sizeof lab, "%.10g", exp2(e)); /* 65536, 0.5 */
      else snprintf(lab, sizeof lab, "2^%.0f", e);
      sb_printf(b, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", ML, CW - MR, y, y);
      sb_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", ML - 6, y + 4, lab);
    }
  } else {
    double step = nice_step(a.y1 - a.y0, 5), first = ceil(a.y0 / step);
    for (int i = 0; i < MAX_TICKS; i++) {
      double v = (first + i) * step;
      if (!(v <= a.y1 + step * 1e-9)) break;
      double y = py(&a, v);
      tick_label(lab, sizeof lab, v, c->yfmt, step);
      sb_printf(b, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", ML, CW - MR, y, y);
      sb_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", ML - 6, y + 4, lab);
    }
  }
  /* x ticks */
  double xstep = nice_step(a.x1 - a.x0, 6);
  if (c->xinteger && xstep < 1) xstep = 1;
  double xfirst = ceil(a.x0 / xstep);
  for (int i = 0; i < MAX_TICKS; i++) {
    double v = (xfirst + i) * xstep;
    if (!(v <= a.x1 + xstep * 1e-9)) break;
    double x = px(&a, v);
    tick_label(lab, sizeof lab, v, FMT_PLAIN, xstep);
    sb_printf(b, "<line class=\"xtick\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", x, x, CH - MB, CH - MB + 5);
    sb_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, CH - MB + 19, lab);
  }
  sb_printf(b, "<text class=\"axis\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", ML + (CW - ML - MR) / 2, CH - 8);
  sb_esc(b, c->xlabel);
  sb_printf(b, "</text>\n<text class=\"axis\" transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">", MT + (CH - MT - MB) / 2);
  sb_esc(b, c->ylabel);
  sb_puts(b, "</text>\n");

  /* the lines: one per run and quantity, values in data-x / data-y */
  for (size_t i = 0; i < c->ns; i++) {
    const series *s = &c->s[i];
    if (!s->x.n && !s->mx.n) continue;
    const char *col = colour(s->run);
    sb_printf(b, "<g class=\"series\" data-run=\"%zu\" data-series=\"%s\">\n<title>", s->run, s->key);
    sb_esc(b, runs[s->run].path);
    sb_printf(b, ": %s</title>\n", s->label);
    if (s->x.n) {
      /* earlier runs drawn wider, so a run that lies on another still shows */
      double width = 2.0 + 1.5 * (double)(nruns - 1 - s->run);
      char stroke[96];
      snprintf(stroke, sizeof stroke, "stroke=\"%s\" stroke-width=\"%.1f\"%s", col, width > 6.5 ? 6.5 : width,
               s->dashed ? " stroke-dasharray=\"7 4\"" : "");
      /* the polyline carries the values (docs/formats.md); where the line
       * breaks it is not stroked itself and a path beside it draws it */
      sb_printf(b, "<polyline class=\"line\" fill=\"none\" %s data-run=\"%zu\" data-series=\"%s\"", s->breaks.n ? "stroke=\"none\"" : stroke,
                s->run, s->key);
      attr_values(b, "data-x", &s->x);
      attr_values(b, "data-y", &s->y);
      if (s->breaks.n) attr_values(b, "data-breaks", &s->breaks);
      sb_puts(b, " points=\"");
      for (size_t k = 0; k < s->x.n; k++) sb_printf(b, "%s%.2f,%.2f", k ? " " : "", px(&a, s->x.v[k]), py(&a, s->y.v[k]));
      sb_puts(b, "\"/>\n");
      /* the broken line: moved (M) rather than drawn (L) over each break; a
       * point alone between two of them a dot (a round cap on a zero-length
       * line) */
      if (s->breaks.n) sb_printf(b, "<path class=\"line-drawn\" fill=\"none\" %s stroke-linecap=\"round\" d=\"", stroke);
      for (size_t k = 0, nb = 0; s->breaks.n && k < s->x.n; k++) {
        int brk = 0;
        while (nb < s->breaks.n && s->breaks.v[nb] <= s->x.v[k]) brk = 1, nb++;
        int start = k == 0 || brk, next_starts = k + 1 == s->x.n || (nb < s->breaks.n && s->breaks.v[nb] <= s->x.v[k + 1]);
        sb_printf(b, "%s%.2f %.2f%s", start ? (k ? " M" : "M") : " L", px(&a, s->x.v[k]), py(&a, s->y.v[k]),
                  start && next_starts ? " l0 0" : "");
      }
      if (s->breaks.n) sb_puts(b, "\"/>\n");
      if (s->x.n <= 60) /* dots where the points are few enough to tell apart */
        for (size_t k = 0; k < s->x.n; k++) {
          char tx[40], ty[40];
          sb_printf(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.2\" fill=\"%s\"><title>%s %s: %s</title></circle>", px(&a, s->x.v[k]),
                    py(&a, s->y.v[k]), s->dashed ? "#fff" : col, c->xlabel, num(tx, s->x.v[k]), num(ty, s->y.v[k]));
          if (s->dashed) sb_printf(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.2\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"/>", px(&a, s->x.v[k]), py(&a, s->y.v[k]), col);
        }
      sb_puts(b, "\n");
    }
    if (s->mx.n) {
      sb_printf(b, "<g class=\"marks\" data-run=\"%zu\" data-series=\"%s_skipped\"", s->run, s->key);
      attr_values(b, "data-x", &s->mx);
      attr_values(b, "data-count", &s->mcount);
      sb_puts(b, ">");
      for (size_t k = 0; k < s->mx.n; k++) {
        double x = px(&a, s->mx.v[k]), y = py(&a, s->my.v[k]);
        char tx[40];
        sb_printf(b, "<path class=\"skip\" d=\"M%.2f %.2fl10 10m0 -10l-10 10\" stroke=\"%s\"><title>%s %s: %g skipped step%s</title></path>",
                  x - 5, y - 5, col, c->xlabel, num(tx, s->mx.v[k]), s->mcount.v[k], s->mcount.v[k] == 1 ? "" : "s");
      }
      sb_puts(b, "</g>\n");
    }
    sb_puts(b, "</g>\n");
    json_t *o = json_pack("{s:I, s:s, s:s, s:o, s:o}", "run", (json_int_t)s->run, "name", s->key, "label", s->label, "x", dv_json(&s->x), "y",
                          dv_json(&s->y));
    if (s->breaks.n) json_object_set_new(o, "breaks_before_x", dv_json(&s->breaks));
    if (s->mx.n) {
      json_object_set_new(o, "skipped_x", dv_json(&s->mx));
      json_object_set_new(o, "skipped_count", dv_json(&s->mcount));
    }
    json_array_append_new(sj, o);
  }
  sb_puts(b, "</svg>\n</figure>\n");
  json_array_append_new(charts_json, cj);
}

/* ---- the memory breakdown ---------------------------------------------- */

static const char *dtype_colour(const char *dt) {
  static const struct {
    const char *name, *colour;
  } m[] = {{"f32", "#4c72b0"}, {"f16", "#dd8452"}, {"bf16", "#55a868"}, {"f64", "#8172b3"},
           {"i64", "#937860"}, {"i32", "#8c8c8c"}, {"u8", "#ccb974"}, {"bool", "#64b5cd"}};
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    if (strcmp(m[i].name, dt) == 0) return m[i].colour;
  return "#c44e52";
}

/* The categories in the library's order, then any others in the file's. */
static size_t memory_categories(size_t nruns, const json_t **mems, const char **cats, size_t max) {
  size_t n = 0;
  for (int c = 0; c < AMPC_MEM_COUNT && n < max; c++) cats[n++] = ampc_mem_category_name((ampc_mem_category)c);
  for (size_t r = 0; r < nruns; r++) {
    const char *key;
    json_t *v;
    if (!mems[r]) continue;
    json_object_foreach((json_t *)mems[r], key, v) {
      if (!json_is_object(v)) continue;
      size_t k = 0;
      while (k < n && strcmp(cats[k], key) != 0) k++;
      if (k == n && n < max) cats[n++] = key;
    }
  }
  return n;
}

static void render_memory(sbuf *b, const run_t *runs, size_t nruns) {
  const json_t **mems = calloc(nruns ? nruns : 1, sizeof *mems);
  int any = 0;
  if (!mems) return;
  for (size_t r = 0; r < nruns; r++) {
    mems[r] = NULL;
    for (size_t i = runs[r].nep; i-- > 0;)
      if (runs[r].ep[i].memory) {
        mems[r] = runs[r].ep[i].memory;
        any = 1;
        break;
      }
  }
  if (!any) {
    free(mems);
    return;
  }
  const char *cats[32];
  size_t ncat = memory_categories(nruns, mems, cats, 32);
  double maxbytes = 1;
  for (size_t r = 0; r < nruns; r++)
    for (size_t c = 0; c < ncat && mems[r]; c++) {
      json_t *t = json_object_get(json_object_get(mems[r], cats[c]), "total");
      if (json_is_integer(t)) maxbytes = fmax(maxbytes, (double)json_integer_value(t));
    }
  const double row = 20, gap = 12, left = 150, width = 1040, barw = width - left - 110;
  double height = 30 + (double)ncat * ((double)nruns * row + gap);
  sb_puts(b, "<section id=\"memory\"><h2>Memory by category and type</h2>\n<p class=\"note\">Bytes the library accounts for, as "
             "`ampc train` reported them (the last epoch record that has them); a bar's colour: the storage type; the mark at its left: "
             "the run's colour, as in the table of runs; its label: the category's total.</p>\n");
  sb_printf(b, "<svg class=\"memory\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" role=\"img\" aria-label=\"memory breakdown\">\n", width,
            height, width, height);
  /* legend of the types */
  const char *types[] = {"f32", "f16", "bf16", "i64", "i32"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    sb_printf(b, "<rect x=\"%.0f\" y=\"4\" width=\"14\" height=\"14\" fill=\"%s\"/><text class=\"tick\" x=\"%.0f\" y=\"16\">%s</text>\n", left + (double)i * 80,
              dtype_colour(types[i]), left + (double)i * 80 + 19, types[i]);
  double y = 30;
  for (size_t c = 0; c < ncat; c++) {
    char ec[256], ed[256];
    sb_printf(b, "<text class=\"axis\" x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", left - 10, y + (double)nruns * row / 2 + 4,
              html(ec, sizeof ec, cats[c]));
    for (size_t r = 0; r < nruns; r++, y += row) {
      json_t *cat = mems[r] ? json_object_get(mems[r], cats[c]) : NULL;
      sb_printf(b, "<rect x=\"%.0f\" y=\"%.1f\" width=\"5\" height=\"%.0f\" fill=\"%s\"/>", left - 7, y + 2, row - 4, colour(r));
      if (!json_is_object(cat)) continue;
      double x = left, total = 0;
      const char *dt;
      json_t *v;
      json_object_foreach(cat, dt, v) {
        if (strcmp(dt, "total") == 0 || !json_is_integer(v)) continue;
        double bytes = (double)json_integer_value(v), w = bytes / maxbytes * barw;
        total += bytes;
        sb_printf(b, "<rect class=\"mem\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" data-run=\"%zu\" data-category=\"%s\" data-dtype=\"%s\" data-bytes=\"%lld\"><title>",
                  x, y + 2, w, row - 4, dtype_colour(dt), r, ec, html(ed, sizeof ed, dt), (long long)json_integer_value(v));
        sb_esc(b, runs[r].path);
        sb_printf(b, ": %s %s %.3f MB</title></rect>", ec, ed, bytes / 1e6);
        x += w;
      }
      sb_printf(b, "<text class=\"tick\" x=\"%.2f\" y=\"%.1f\">%.1f MB</text>\n", x + 6, y + row - 6, total / 1e6);
    }
    y += gap;
  }
  sb_puts(b, "</svg>\n");
  /* the same as a table */
  sb_puts(b, "<table class=\"memtable\"><tr><th>run</th><th>category</th><th>by type</th><th>total MB</th></tr>\n");
  for (size_t r = 0; r < nruns; r++)
    for (size_t c = 0; c < ncat && mems[r]; c++) {
      json_t *cat = json_object_get(mems[r], cats[c]);
      if (!json_is_object(cat)) continue;
      char ec[256], ed[256];
      sb_printf(b, "<tr><td><span class=\"swatch\" style=\"background:%s\"></span>%zu</td><td>%s</td><td>", colour(r), r + 1,
                html(ec, sizeof ec, cats[c]));
      const char *dt;
      json_t *v;
      int first = 1;
      json_object_foreach(cat, dt, v) {
        if (strcmp(dt, "total") == 0 || !json_is_integer(v)) continue;
        sb_printf(b, "%s%s %.3f MB", first ? "" : ", ", html(ed, sizeof ed, dt), (double)json_integer_value(v) / 1e6);
        first = 0;
      }
      json_t *t = json_object_get(cat, "total");
      sb_printf(b, "</td><td class=\"num\">%.3f</td></tr>\n", json_is_integer(t) ? (double)json_integer_value(t) / 1e6 : 0.0);
    }
  sb_puts(b, "</table></section>\n");
  free(mems);
}

/* ---- the page ------------------------------------------------------------ */

static const char *page_css =
    "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:16px 20px;color:#222;background:#fff}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}"
    ".note{color:#666;font-size:12px;font-weight:normal}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "td.path{max-width:28em;overflow-wrap:anywhere}tr.run td:first-child{white-space:nowrap}"
    ".swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px;border-radius:2px}"
    ".grid-charts{display:flex;flex-wrap:wrap;gap:14px}"
    "figure.chart{margin:0;border:1px solid #e4e4e4;border-radius:4px;padding:6px 6px 0;width:540px}"
    "figcaption{font-weight:600;margin:0 0 2px 6px}"
    "svg .frame{fill:#fafafa;stroke:#bbb}svg .grid{stroke:#e2e2e2}svg .xtick{stroke:#999}"
    "svg text{fill:#444;font-size:11px}svg text.axis{font-size:12px;fill:#222}"
    "svg .skip{stroke-width:2.2;fill:none}";

static void summary_table(sbuf *b, const run_t *runs, size_t nruns) {
  sb_puts(b, "<table class=\"runs\"><tr><th>run</th><th>metrics file</th><th>opt level</th><th>half</th><th>epochs</th><th>final test acc</th>"
             "<th>best test acc</th><th>final train / test loss</th><th>skipped steps</th><th>final loss scale</th><th>time s</th>"
             "<th>images/s</th></tr>\n");
  for (size_t r = 0; r < nruns; r++) {
    const run_t *u = &runs[r];
    double best = NAN, secs = 0, ips = 0;
    int64_t best_ep = -1, skipped = 0, nips = 0;
    for (size_t i = 0; i < u->nep; i++) {
      const epoch_rec *e = &u->ep[i];
      if (isfinite(e->test_acc) && !(e->test_acc <= best)) {
        best = e->test_acc;
        best_ep = e->epoch;
      }
      if (isfinite(e->seconds)) secs += e->seconds;
      if (isfinite(e->ips)) {
        ips += e->ips;
        nips++;
      }
      if (e->skipped > 0) skipped += e->skipped;
    }
    if (!u->nep)
      for (size_t i = 0; i < u->nst; i++) skipped += u->st[i].skipped;
    const epoch_rec *last = u->nep ? &u->ep[u->nep - 1] : NULL;
    sb_printf(b, "<tr class=\"run\" data-run=\"%zu\"><td><span class=\"swatch\" style=\"background:%s\"></span>%zu</td><td class=\"path\">", r,
              colour(r), r + 1);
    sb_esc(b, u->path);
    sb_puts(b, "</td><td>");
    sb_esc(b, u->opt_level[0] ? u->opt_level : "?");
    sb_puts(b, "</td><td>");
    /* (O0 runs nothing in 16 bits: its half type is only the default's) */
    sb_esc(b, !strcmp(u->opt_level, "O0") ? "-" : u->half[0] ? u->half : "?");
    sb_printf(b, "</td><td class=\"num\">%zu</td>", u->nep);
    if (last && isfinite(last->test_acc)) sb_printf(b, "<td class=\"num\">%.4f</td>", last->test_acc);
    else sb_puts(b, "<td>-</td>");
    if (best_ep >= 0) sb_printf(b, "<td class=\"num\">%.4f (epoch %lld)</td>", best, (long long)best_ep);
    else sb_puts(b, "<td>-</td>");
    if (last && (isfinite(last->train_loss) || isfinite(last->test_loss) || last->train_nonfinite || last->test_nonfinite)) {
      char tr[32] = "-", te[32] = "-";
      if (isfinite(last->train_loss)) snprintf(tr, sizeof tr, "%.4f", last->train_loss);
      else if (last->train_nonfinite) snprintf(tr, sizeof tr, "not finite");
      if (isfinite(last->test_loss)) snprintf(te, sizeof te, "%.4f", last->test_loss);
      else if (last->test_nonfinite) snprintf(te, sizeof te, "not finite");
      sb_printf(b, "<td class=\"num\">%s / %s</td>", tr, te);
    } else {
      sb_puts(b, "<td>-</td>");
    }
    sb_printf(b, "<td class=\"num\">%lld</td>", (long long)skipped);
    double scale = last ? last->loss_scale : (u->nst ? u->st[u->nst - 1].loss_scale : NAN);
    if (isfinite(scale)) sb_printf(b, "<td class=\"num\">%g</td>", scale);
    else sb_puts(b, "<td>-</td>");
    sb_printf(b, "<td class=\"num\">%.1f</td>", secs);
    if (nips) sb_printf(b, "<td class=\"num\">%.1f</td></tr>\n", ips / (double)nips);
    else sb_puts(b, "<td>-</td></tr>\n");
  }
  sb_puts(b, "</table>\n<p class=\"note\">Solid lines: training (or per-step) values; dashed lines with open dots: test values; "
             "&#215;: skipped steps (gradient overflow). Hover a point for its value.</p>\n");
}

/* The step axis is shared by every run when each has step records or counts
 * its steps in the epoch records; otherwise the per-epoch charts use epochs. */
static int step_axis(const run_t *runs, size_t nruns) {
  for (size_t r = 0; r < nruns; r++) {
    if (runs[r].nst) continue;
    for (size_t i = 0; i < runs[r].nep; i++)
      if (runs[r].ep[i].steps < 0) return 0;
  }
  return 1;
}

typedef enum { Q_LOSS_SCALE, Q_LR } step_quantity;

/* Loss scale or learning rate: per step from step records where a run has
 * them, else per epoch (at the epoch's last step, or at the epoch). */
static void fill_step_chart(chart *c, const run_t *runs, size_t nruns, step_quantity q, int by_step) {
  for (size_t r = 0; r < nruns; r++) {
    const run_t *u = &runs[r];
    int have_steps = 0;
    for (size_t i = 0; i < u->nst; i++)
      if (isfinite(q == Q_LOSS_SCALE ? u->st[i].loss_scale : u->st[i].lr)) have_steps = 1;
    const char *key = q == Q_LOSS_SCALE ? (have_steps && by_step ? "step_loss_scale" : "loss_scale") : (have_steps && by_step ? "step_lr" : "lr");
    series *s = chart_add(c, r, key, q == Q_LOSS_SCALE ? "loss scale" : "learning rate", 0);
    if (have_steps && by_step) {
      for (size_t i = 0; i < u->nst; i++) {
        const step_rec *t = &u->st[i];
        double v = q == Q_LOSS_SCALE ? t->loss_scale : t->lr;
        point(c, s, (double)t->step, v);
        if (q == Q_LOSS_SCALE && t->skipped) mark(c, s, (double)t->step, v, 1);
      }
    } else {
      for (size_t i = 0; i < u->nep; i++) {
        const epoch_rec *e = &u->ep[i];
        double x = by_step ? (double)e->steps : (double)e->epoch, v = q == Q_LOSS_SCALE ? e->loss_scale : e->lr;
        point(c, s, x, v);
        if (q == Q_LOSS_SCALE && e->skipped > 0) mark(c, s, x, v, (double)e->skipped);
      }
    }
  }
}

typedef enum { E_TRAIN_LOSS, E_TEST_LOSS, E_TEST_ACC, E_IPS, E_UNDERFLOW } epoch_quantity;

static double epoch_value(const epoch_rec *e, epoch_quantity q) {
  switch (q) {
    case E_TRAIN_LOSS: return e->train_loss;
    case E_TEST_LOSS: return e->test_loss;
    case E_TEST_ACC: return e->test_acc;
    case E_IPS: return e->ips;
    case E_UNDERFLOW: return e->underflow;
  }
  return NAN;
}

static void fill_epoch_series(chart *c, const run_t *runs, size_t nruns, epoch_quantity q, const char *key, const char *label, int dashed) {
  for (size_t r = 0; r < nruns; r++) {
    series *s = chart_add(c, r, key, label, dashed);
    for (size_t i = 0; i < runs[r].nep; i++) {
      const epoch_rec *e = &runs[r].ep[i];
      if ((q == E_TRAIN_LOSS && e->train_nonfinite) || (q == E_TEST_LOSS && e->test_nonfinite)) gap(s);
      point(c, s, (double)e->epoch, epoch_value(e, q));
    }
  }
}

typedef enum { S_LOSS, S_GRAD_NORM } step_series_q;

static void fill_step_series(chart *c, const run_t *runs, size_t nruns, step_series_q q, const char *key, const char *label) {
  for (size_t r = 0; r < nruns; r++) {
    if (!runs[r].nst) continue;
    series *s = chart_add(c, r, key, label, 0);
    for (size_t i = 0; i < runs[r].nst; i++) {
      const step_rec *t = &runs[r].st[i];
      if (q == S_LOSS && t->loss_nonfinite) gap(s);
      point(c, s, (double)t->step, q == S_LOSS ? t->loss : t->grad_norm);
      if (q == S_LOSS && t->skipped) mark(c, s, (double)t->step, t->loss, 1);
    }
  }
}

/* Text into the page's JSON data block. '<', which JSON has only inside
 * strings, is written \u003c: nothing from a file can end the block
 * ("</script") or confuse it ("<!--"). */
static void json_block(sbuf *b, const char *s) {
  for (const char *p = s, *q; *p; p = q) {
    q = strchr(p, '<');
    if (!q) q = p + strlen(p);
    sb_put(b, p, (size_t)(q - p));
    if (*q) sb_puts(b, "\\u003c"), q++;
  }
}

/* The same for JSON that jansson wrote (NULL: it ran out of memory), freed. */
static void json_block_dump(sbuf *b, char *js) {
  if (!js) b->oom = 1;
  else json_block(b, js);
  free(js);
}

/* The page to standard output, past stdio (report prints nothing else
 * there): a failure is reported here, with its reason, and leaves stdout's
 * error flag clear, so that main's check of standard output does not report
 * it a second time. */
static int write_stdout(const char *p, size_t n) {
  while (n > 0) {
    ssize_t k = write(fileno(stdout), p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      cli_error("standard output: write error: %s", k < 0 ? strerror(errno) : "nothing written");
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static ampc_status fill_page(void *ctx, ampc__wfile *w) {
  const sbuf *b = ctx;
  return ampc__wfile_write(w, b->p, b->n);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ampc report RUN.jsonl [MORE.jsonl ...] [-o FILE] [--title TEXT]\n\n"
          "Draws the metrics that `ampc train --metrics FILE` wrote (one JSON object per epoch, and\n"
          "per step with --log-every) as one self-contained HTML page of SVG charts: train and test\n"
          "loss, test accuracy, loss scale with the skipped steps marked, learning rate, images/s,\n"
          "gradient underflow share (--amp-report), per-step loss and the memory by category and\n"
          "type. Several files go on one page, one colour each.\n\n"
          "options:\n"
          "  -o, --output FILE             where to write the page (default report.html; - for stdout)\n"
          "  --title TEXT                  the page's heading (default: ampc report)\n"
          "  --help                        show this help\n");
}

int cmd_report(int argc, char **argv) {
  const char *out = "report.html", *title = "ampc report";
  const char **files = calloc((size_t)argc + 1, sizeof *files);
  size_t nfiles = 0;
  int only_files = 0;
  if (!files) {
    cli_error("report: out of memory");
    return 1;
  }
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (only_files || a[0] != '-' || strcmp(a, "-") == 0) {
      files[nfiles++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_files = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      free(files);
      return 0;
    } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0 || strcmp(a, "--title") == 0) {
      if (i + 1 >= argc || !argv[i + 1][0]) {
        cli_error("report: %s: %s value", a, i + 1 >= argc ? "missing" : "empty");
        free(files);
        return 2;
      }
      *(strcmp(a, "--title") == 0 ? &title : &out) = argv[++i];
    } else if (strncmp(a, "--output=", 9) == 0 && a[9]) {
      out = a + 9;
    } else if (strncmp(a, "--title=", 8) == 0 && a[8]) {
      title = a + 8;
    } else {
      cli_error("report: unknown option '%s' (see ampc report --help)", a);
      free(files);
      return 2;
    }
  }
  if (!nfiles) {
    cli_error("report: no metrics file given (usage: ampc report RUN.jsonl [MORE.jsonl ...] [-o FILE])");
    free(files);
    return 2;
  }

  for (size_t i = 0; strcmp(out, "-") != 0 && i < nfiles; i++)
    if (cli_same_file(out, files[i])) {
      cli_error("report: -o '%s' is the metrics file it reads; choose another output", out);
      free(files);
      return 2;
    }
  run_t *runs = calloc(nfiles, sizeof *runs);
  int rc = runs ? 0 : 1;
  size_t nread = 0;
  for (; rc == 0 && nread < nfiles; nread++)
    if (read_run(&runs[nread], files[nread]) < 0) {
      rc = 1;
      nread++;
      break;
    }
  if (rc) {
    for (size_t r = 0; runs && r < nread; r++) free_run(&runs[r]);
    free(runs);
    free(files);
    return 1;
  }

  /* the charts, in page order */
  int by_step = step_axis(runs, nfiles);
  int have_steps = 0, have_grad_norm = 0;
  for (size_t r = 0; r < nfiles; r++) {
    have_steps |= runs[r].nst > 0;
    for (size_t i = 0; i < runs[r].nst; i++) have_grad_norm |= isfinite(runs[r].st[i].grad_norm);
  }
  const char *step_x = by_step ? "step" : "epoch";
  chart charts[8] = {
      {.id = "loss", .title = "Loss per epoch", .note = "(train solid, test dashed)", .xlabel = "epoch", .ylabel = "cross-entropy loss", .xinteger = 1},
      {.id = "test_acc", .title = "Test accuracy", .xlabel = "epoch", .ylabel = "accuracy", .xinteger = 1, .yfmt = FMT_PERCENT},
      {.id = "loss_scale", .title = by_step ? "Loss scale" : "Loss scale per epoch",
       .note = have_steps ? "(per step where step records exist; x: skipped steps)" : "(at the end of each epoch; x: epochs with skipped steps)",
       .xlabel = step_x, .ylabel = "loss scale (log2 axis)", .logy = 1, .xinteger = 1},
      {.id = "lr", .title = "Learning rate", .xlabel = step_x, .ylabel = "learning rate", .xinteger = 1},
      {.id = "images_per_s", .title = "Training throughput", .xlabel = "epoch", .ylabel = "images/s", .xinteger = 1},
      {.id = "grad_underflow", .title = "Gradient underflow share", .note = "(half-precision gradient values flushed to zero; --amp-report)",
       .xlabel = "epoch", .ylabel = "share of values", .xinteger = 1, .yfmt = FMT_PERCENT},
      {.id = "step_loss", .title = "Loss per step", .note = "(x: skipped steps)", .xlabel = "step", .ylabel = "training loss", .xinteger = 1},
      {.id = "grad_norm", .title = "Gradient norm per step", .xlabel = "step", .ylabel = "global gradient norm", .xinteger = 1},
  };
  size_t ncharts = 8;
  /* losses that were not finite (null) have no point: the loss charts say
   * how many, rather than drawing a line over them as if nothing happened */
  size_t bad_ep = 0, bad_st = 0;
  for (size_t r = 0; r < nfiles; r++) {
    for (size_t i = 0; i < runs[r].nep; i++) bad_ep += runs[r].ep[i].train_nonfinite || runs[r].ep[i].test_nonfinite;
    for (size_t i = 0; i < runs[r].nst; i++) bad_st += runs[r].st[i].loss_nonfinite;
  }
  char note_ep[160], note_st[160];
  if (bad_ep) {
    snprintf(note_ep, sizeof note_ep, "(train solid, test dashed; %zu epoch%s with a loss that was not finite, not drawn: the line breaks there)",
             bad_ep, bad_ep == 1 ? "" : "s");
    charts[0].note = note_ep;
  }
  if (bad_st) {
    snprintf(note_st, sizeof note_st, "(x: skipped steps; %zu step%s with a loss that was not finite, not drawn: the loss scale chart marks the skipped ones)",
             bad_st, bad_st == 1 ? "" : "s");
    charts[6].note = note_st;
  }
  fill_epoch_series(&charts[0], runs, nfiles, E_TRAIN_LOSS, "train_loss", "train loss", 0);
  fill_epoch_series(&charts[0], runs, nfiles, E_TEST_LOSS, "test_loss", "test loss", 1);
  fill_epoch_series(&charts[1], runs, nfiles, E_TEST_ACC, "test_acc", "test accuracy", 0);
  fill_step_chart(&charts[2], runs, nfiles, Q_LOSS_SCALE, by_step);
  fill_step_chart(&charts[3], runs, nfiles, Q_LR, by_step);
  fill_epoch_series(&charts[4], runs, nfiles, E_IPS, "images_per_s", "images/s", 0);
  fill_epoch_series(&charts[5], runs, nfiles, E_UNDERFLOW, "grad_underflow_fraction", "gradient underflow share", 0);
  if (have_steps) fill_step_series(&charts[6], runs, nfiles, S_LOSS, "step_loss", "loss");
  if (have_grad_norm) fill_step_series(&charts[7], runs, nfiles, S_GRAD_NORM, "grad_norm", "gradient norm");

  sbuf b = {0};
  sb_puts(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>");
  sb_esc(&b, title);
  sb_puts(&b, ": ");
  for (size_t r = 0; r < nfiles; r++) {
    sb_esc(&b, runs[r].path);
    if (r + 1 < nfiles) sb_puts(&b, ", ");
  }
  sb_printf(&b, "</title>\n<meta name=\"generator\" content=\"ampc %s\">\n<style>%s</style>\n</head>\n<body>\n<h1>", ampc_version_get()->version,
            page_css);
  sb_esc(&b, title);
  sb_printf(&b, "</h1>\n<p class=\"note\">%zu run%s; made by ampc %s from the metrics files below.</p>\n", nfiles, nfiles == 1 ? "" : "s",
            ampc_version_get()->version);
  summary_table(&b, runs, nfiles);
  sb_puts(&b, "<div class=\"grid-charts\">\n");
  json_t *charts_json = json_array();
  for (size_t i = 0; i < ncharts; i++) render_chart(&b, &charts[i], runs, nfiles, charts_json);
  sb_puts(&b, "</div>\n");
  render_memory(&b, runs, nfiles);

  /* everything drawn, machine-readable: the runs' records as read (text
   * already JSON), the rest as jansson writes it */
  sb_puts(&b, "<script type=\"application/json\" id=\"ampc-report-data\">");
  json_block(&b, "{\"generator\":");
  json_t *gen = json_string(ampc_version());
  json_block_dump(&b, gen ? json_dumps(gen, JSON_ENCODE_ANY) : NULL);
  json_decref(gen);
  json_block(&b, ",\"runs\":[");
  for (size_t r = 0; r < nfiles; r++) {
    char *file = utf8_copy(runs[r].path);
    json_t *head = file ? json_pack("{s:s, s:s, s:s, s:s}", "file", file, "colour", colour(r), "opt_level", runs[r].opt_level,
                                    "half", runs[r].half)
                        : NULL;
    free(file);
    char *hs = head ? json_dumps(head, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(head);
    if (hs) hs[strlen(hs) - 1] = '\0'; /* its closing brace: the records follow */
    if (r) json_block(&b, ",");
    json_block_dump(&b, hs);
    json_block(&b, ",\"records\":[");
    json_block(&b, runs[r].records.p ? runs[r].records.p : "");
    json_block(&b, "]}");
  }
  json_block(&b, "],\"charts\":");
  json_block_dump(&b, json_dumps(charts_json, JSON_COMPACT | JSON_REAL_PRECISION(17)));
  json_decref(charts_json);
  json_block(&b, "}");
  sb_puts(&b, "</script>\n");
  sb_puts(&b, "</body>\n</html>\n");
  size_t drawn = 0;
  for (size_t i = 0; i < ncharts; i++) {
    for (size_t k = 0; k < charts[i].ns; k++)
      if (charts[i].s[k].x.n || charts[i].s[k].mx.n) {
        drawn++;
        break;
      }
    chart_free(&charts[i]);
  }

  if (b.oom) {
    cli_error("report: out of memory");
    rc = 1;
  } else if (strcmp(out, "-") == 0) {
    if (write_stdout(b.p, b.n) < 0) rc = 1;
  } else if (ampc__write_file_atomic(out, fill_page, &b) < 0) {
    cli_lib_error("-o");
    rc = 1;
  } else {
    fprintf(stderr, "ampc: wrote %s (%zu run%s, %zu charts)\n", cli_shown(out), nfiles, nfiles == 1 ? "" : "s", drawn);
  }
  free(b.p);
  for (size_t r = 0; r < nfiles; r++) free_run(&runs[r]);
  free(runs);
  free(files);
  return rc;
}
