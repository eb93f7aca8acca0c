/* Opt levels, their property table, user overrides and their validation. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ampc/amp_config.h"
#include "core/status_internal.h"

/* More scalers than any model has losses: a bound keeps a typo (or a hostile
 * flag) from allocating a billion of them. */
#define AMP_MAX_LOSSES 1024

static const char *const level_names[AMPC_OPT_COUNT] = {"O0", "O1", "O2", "O3"};

ampc_status ampc_opt_level_parse(const char *s, ampc_opt_level *out) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_opt_level_parse: out is NULL");
  if (s && (s[0] == 'O' || s[0] == 'o') && s[1] >= '0' && s[1] <= '3' && s[2] == '\0') {
    *out = (ampc_opt_level)(s[1] - '0');
    return AMPC_OK;
  }
  return ampc__error(AMPC_EINVAL, "amp: unknown opt level '%s' (expected O0, O1, O2 or O3)", s ? s : "");
}

const char *ampc_opt_level_name(ampc_opt_level level) {
  return (unsigned)level < AMPC_OPT_COUNT ? level_names[level] : "?";
}

/* apex's initial dynamic scale (2^16) and its max_loss_scale default (2^24). */
#define INIT_DYNAMIC_SCALE 65536.0f
#define DEFAULT_MAX_SCALE 16777216.0f

ampc_status ampc_amp_config_init(ampc_amp_config *c, ampc_opt_level level, ampc_dtype half_type) {
  if (!c) return ampc__error(AMPC_EINVAL, "ampc_amp_config_init: config is NULL");
  if ((unsigned)level >= AMPC_OPT_COUNT)
    return ampc__error(AMPC_EINVAL, "amp: opt level %d out of range (O0..O3)", (int)level);
  if (half_type != AMPC_DTYPE_F16 && half_type != AMPC_DTYPE_BF16)
    return ampc__error(AMPC_EINVAL, "amp: half type must be f16 or bf16, not %s", ampc_dtype_name(half_type));
  /* Rows of apex's table (frontend.py O0..O3). -1 is apex's None. */
  static const struct {
    int cast_half, autocast, keep_bn, master, dynamic;
  } rows[AMPC_OPT_COUNT] = {
      [AMPC_OPT_O0] = {0, 0, -1, 0, 0},
      [AMPC_OPT_O1] = {0, 1, -1, -1, 1},
      [AMPC_OPT_O2] = {1, 0, 1, 1, 1},
      [AMPC_OPT_O3] = {1, 0, 0, 0, 0},
  };
  ampc_amp_config d = {0};
  d.opt_level = level;
  d.half_type = half_type;
  d.cast_model_type = rows[level].cast_half ? half_type : AMPC_DTYPE_F32;
  d.autocast = rows[level].autocast;
  d.keep_batchnorm_fp32 = rows[level].keep_bn;
  d.master_weights = rows[level].master;
  /* bf16 keeps f32's exponent range: gradients do not underflow, so no loss
   * scaling at any level (static 1.0). f16 follows apex. */
  d.loss_scale_dynamic = half_type == AMPC_DTYPE_BF16 ? 0 : rows[level].dynamic;
  d.loss_scale = d.loss_scale_dynamic ? INIT_DYNAMIC_SCALE : 1.0f;
  d.min_loss_scale = 0.0f;
  d.max_loss_scale = DEFAULT_MAX_SCALE;
  d.scale_window = 2000;
  d.growth_factor = 2.0f;
  d.backoff_factor = 0.5f;
  d.hysteresis = 1;
  d.consecutive_hysteresis = 0;
  d.num_losses = 1;
  d.user_set = 0;
  *c = d;
  return AMPC_OK;
}

/* ---- value parsers: each returns 0 or -1 (the caller words the error) ---- */

static int parse_bool(const char *v, int *out) {
  static const char *const t[] = {"true", "on", "yes", "1"}, *const f[] = {"false", "off", "no", "0"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(v, t[i]) == 0) return *out = 1, 0;
    if (strcasecmp(v, f[i]) == 0) return *out = 0, 0;
  }
  return -1;
}

/* A plain decimal/scientific number, no surrounding spaces. */
static int parse_plain_number(const char *v, size_t n, double *out) {
  char tmp[64];
  if (n == 0 || n >= sizeof tmp || isspace((unsigned char)v[0])) return -1;
  memcpy(tmp, v, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  double x = strtod(tmp, &end);
  if (*end != '\0' || errno == ERANGE || isnan(x)) return -1;
  *out = x;
  return 0;
}

/* "65536", "6.5e4", or a power "2**16" / "2^16" (how apex users write scales). */
static int parse_number(const char *v, double *out) {
  const char *p = strstr(v, "**");
  size_t oplen = 2;
  if (!p) p = strchr(v, '^'), oplen = 1;
  if (!p) return parse_plain_number(v, strlen(v), out);
  double b, e;
  if (parse_plain_number(v, (size_t)(p - v), &b) < 0 || parse_plain_number(p + oplen, strlen(p + oplen), &e) < 0)
    return -1;
  double x = pow(b, e);
  if (isnan(x)) return -1;
  *out = x;
  return 0;
}

/* Fits in a float: finite doubles beyond FLT_MAX would silently become inf. */
static int to_float(double x, float *out) {
  if (isfinite(x) && fabs(x) > 3.4028234663852886e38) return -1;
  *out = (float)x;
  return 0;
}

static int parse_int(const char *v, int *out) {
  if (!v[0] || isspace((unsigned char)v[0])) return -1;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (*end != '\0' || errno == ERANGE || x < -2147483647LL - 1 || x > 2147483647LL) return -1;
  *out = (int)x;
  return 0;
}

/* ---- the property table ---- */

typedef ampc_status (*prop_setter)(ampc_amp_config *c, const char *name, const char *v);

static ampc_status bad_value(const char *name, const char *v, const char *expected) {
  return ampc__error(AMPC_EINVAL, "amp: %s: expected %s, got '%s'", name, expected, v);
}

static ampc_status set_cast_model_type(ampc_amp_config *c, const char *name, const char *v) {
  ampc_dtype t;
  if (strcasecmp(v, "none") == 0) t = AMPC_DTYPE_F32;
  else if (ampc_dtype_parse(v, &t) < 0) return bad_value(name, v, "f32, f16, bf16 or none");
  c->cast_model_type = t;
  return AMPC_OK;
}

static ampc_status set_bool_field(int *field, const char *name, const char *v) {
  int b;
  if (parse_bool(v, &b) < 0) return bad_value(name, v, "true or false");
  *field = b;
  return AMPC_OK;
}
static ampc_status set_autocast(ampc_amp_config *c, const char *n, const char *v) { return set_bool_field(&c->autocast, n, v); }
static ampc_status set_keep_bn(ampc_amp_config *c, const char *n, const char *v) { return set_bool_field(&c->keep_batchnorm_fp32, n, v); }
static ampc_status set_master(ampc_amp_config *c, const char *n, const char *v) { return set_bool_field(&c->master_weights, n, v); }
static ampc_status set_consecutive(ampc_amp_config *c, const char *n, const char *v) {
  return set_bool_field(&c->consecutive_hysteresis, n, v);
}

static ampc_status positive_float(const char *name, const char *v, float *out) {
  double x;
  float f = 0.0f;
  if (parse_number(v, &x) < 0 || !(x > 0) || to_float(x, &f) < 0 || !isfinite(f) || !(f > 0))
    return bad_value(name, v, "a positive finite number");
  *out = f;
  return AMPC_OK;
}

static ampc_status set_loss_scale(ampc_amp_config *c, const char *name, const char *v) {
  if (strcasecmp(v, "dynamic") == 0) {
    c->loss_scale_dynamic = 1;
    /* Starting a dynamic scale from a static value (1.0) would take 16 growth
     * windows to reach a useful scale; an explicit init_scale wins. */
    if (!(c->user_set & AMPC_AMP_PROP_INIT_SCALE)) c->loss_scale = INIT_DYNAMIC_SCALE;
    return AMPC_OK;
  }
  float f = 0.0f;
  if (positive_float(name, v, &f) < 0) return bad_value(name, v, "'dynamic' or a positive finite number");
  c->loss_scale_dynamic = 0;
  c->loss_scale = f;
  return AMPC_OK;
}

static ampc_status set_init_scale(ampc_amp_config *c, const char *name, const char *v) {
  /* a static scale the user set is kept (the start value shares its field):
   * the two are refused together, naming the static one */
  if (!c->loss_scale_dynamic && (c->user_set & AMPC_AMP_PROP_LOSS_SCALE)) {
    float f;
    AMPC_TRY(positive_float(name, v, &f));
    return ampc__error(AMPC_EINVAL, "amp: init_scale applies to a dynamic loss scale, but loss_scale is static (%g)", (double)c->loss_scale);
  }
  return positive_float(name, v, &c->loss_scale);
}

static ampc_status set_min_scale(ampc_amp_config *c, const char *name, const char *v) {
  double x;
  float f = 0.0f;
  if (strcasecmp(v, "none") == 0) return c->min_loss_scale = 0.0f, AMPC_OK;
  if (parse_number(v, &x) < 0 || !(x >= 0) || to_float(x, &f) < 0 || !isfinite(f))
    return bad_value(name, v, "a finite number >= 0 or none");
  c->min_loss_scale = f;
  return AMPC_OK;
}

static ampc_status set_max_scale(ampc_amp_config *c, const char *name, const char *v) {
  double x;
  float f = 0.0f;
  if (strcasecmp(v, "none") == 0) return c->max_loss_scale = INFINITY, AMPC_OK;
  if (parse_number(v, &x) < 0 || !(x > 0) || to_float(x, &f) < 0 || !(f > 0))
    return bad_value(name, v, "a positive number, inf or none");
  c->max_loss_scale = f;
  return AMPC_OK;
}

static ampc_status set_int_min1(int *field, const char *name, const char *v) {
  int x;
  /* (the CLI's other counts' bound: more is no window or allowance at all) */
  if (parse_int(v, &x) < 0 || x < 1 || x > 1000000000) return bad_value(name, v, "an integer from 1 to 1000000000");
  *field = x;
  return AMPC_OK;
}
static ampc_status set_window(ampc_amp_config *c, const char *n, const char *v) { return set_int_min1(&c->scale_window, n, v); }
static ampc_status set_hysteresis(ampc_amp_config *c, const char *n, const char *v) { return set_int_min1(&c->hysteresis, n, v); }
static ampc_status set_num_losses(ampc_amp_config *c, const char *n, const char *v) {
  int x;
  if (parse_int(v, &x) < 0 || x < 1 || x > AMP_MAX_LOSSES)
    return bad_value(n, v, "an integer >= 1 and <= 1024");
  c->num_losses = x;
  return AMPC_OK;
}

static ampc_status set_growth(ampc_amp_config *c, const char *name, const char *v) {
  double x;
  float f = 0.0f;
  if (parse_number(v, &x) < 0 || !(x > 1) || to_float(x, &f) < 0 || !isfinite(f) || !(f > 1))
    return bad_value(name, v, "a finite number > 1");
  c->growth_factor = f;
  return AMPC_OK;
}

static ampc_status set_backoff(ampc_amp_config *c, const char *name, const char *v) {
  double x;
  float f = 0.0f;
  if (parse_number(v, &x) < 0 || !(x > 0 && x < 1) || to_float(x, &f) < 0 || !(f > 0 && f < 1))
    return bad_value(name, v, "a number in (0, 1)");
  c->backoff_factor = f;
  return AMPC_OK;
}

static const struct {
  const char *name, *alias;
  unsigned bit;
  prop_setter set;
} props[] = {
    {"cast_model_type", NULL, AMPC_AMP_PROP_CAST_MODEL_TYPE, set_cast_model_type},
    {"autocast", "patch_torch_functions", AMPC_AMP_PROP_AUTOCAST, set_autocast},
    {"keep_batchnorm_fp32", NULL, AMPC_AMP_PROP_KEEP_BATCHNORM_FP32, set_keep_bn},
    {"master_weights", NULL, AMPC_AMP_PROP_MASTER_WEIGHTS, set_master},
    {"loss_scale", NULL, AMPC_AMP_PROP_LOSS_SCALE, set_loss_scale},
    {"init_scale", NULL, AMPC_AMP_PROP_INIT_SCALE, set_init_scale},
    {"min_loss_scale", NULL, AMPC_AMP_PROP_MIN_LOSS_SCALE, set_min_scale},
    {"max_loss_scale", NULL, AMPC_AMP_PROP_MAX_LOSS_SCALE, set_max_scale},
    {"scale_window", NULL, AMPC_AMP_PROP_SCALE_WINDOW, set_window},
    {"growth_factor", NULL, AMPC_AMP_PROP_GROWTH_FACTOR, set_growth},
    {"backoff_factor", NULL, AMPC_AMP_PROP_BACKOFF_FACTOR, set_backoff},
    {"hysteresis", NULL, AMPC_AMP_PROP_HYSTERESIS, set_hysteresis},
    {"consecutive_hysteresis", NULL, AMPC_AMP_PROP_CONSECUTIVE_HYSTERESIS, set_consecutive},
    {"num_losses", NULL, AMPC_AMP_PROP_NUM_LOSSES, set_num_losses},
};
#define NPROPS (sizeof props / sizeof props[0])

ampc_status ampc_amp_config_set(ampc_amp_config *c, const char *property, const char *value) {
  if (!c || !property || !value) return ampc__error(AMPC_EINVAL, "amp: set: NULL argument");
  char name[48];
  size_t n = strlen(property);
  if (n >= sizeof name) return ampc__error(AMPC_EINVAL, "amp: unknown property '%.40s...'", property);
  for (size_t i = 0; i <= n; i++) name[i] = property[i] == '-' ? '_' : property[i];
  for (size_t i = 0; i < NPROPS; i++) {
    if (strcmp(name, props[i].name) != 0 && !(props[i].alias && strcmp(name, props[i].alias) == 0)) continue;
    /* Parse into a copy so that a bad value leaves c as it was. */
    ampc_amp_config t = *c;
    AMPC_TRY(props[i].set(&t, props[i].name, value));
    t.user_set |= props[i].bit;
    *c = t;
    return AMPC_OK;
  }
  return ampc__error(AMPC_EINVAL,
                     "amp: unknown property '%s' (known: cast_model_type, autocast, keep_batchnorm_fp32, "
                     "master_weights, loss_scale, init_scale, min_loss_scale, max_loss_scale, scale_window, "
                     "growth_factor, backoff_factor, hysteresis, consecutive_hysteresis, num_losses)",
                     name);
}

/* ---- validation ---- */

static int is_tristate(int v) { return v == -1 || v == 0 || v == 1; }

ampc_status ampc_amp_config_validate(const ampc_amp_config *c) {
  if (!c) return ampc__error(AMPC_EINVAL, "amp: config is NULL");
  if ((unsigned)c->opt_level >= AMPC_OPT_COUNT)
    return ampc__error(AMPC_EINVAL, "amp: opt level %d out of range (O0..O3)", (int)c->opt_level);
  const char *lvl = level_names[c->opt_level];
  if (c->half_type != AMPC_DTYPE_F16 && c->half_type != AMPC_DTYPE_BF16)
    return ampc__error(AMPC_EINVAL, "amp: half type must be f16 or bf16, not %s", ampc_dtype_name(c->half_type));
  if (c->cast_model_type != AMPC_DTYPE_F32 && c->cast_model_type != AMPC_DTYPE_F16 &&
      c->cast_model_type != AMPC_DTYPE_BF16)
    return ampc__error(AMPC_EINVAL, "amp: cast_model_type must be f32, f16 or bf16, not %s",
                       ampc_dtype_name(c->cast_model_type));
  unsigned u = c->user_set;

  /* The combinations apex's Properties refuses (frontend.py). */
  if (c->opt_level == AMPC_OPT_O1) {
    if (c->cast_model_type != AMPC_DTYPE_F32)
      return ampc__error(AMPC_EINVAL,
                         "amp: O1 casts around ops, not the model: its weights stay f32, so cast_model_type must be "
                         "f32 or none, not %s (to cast the model use O2 or O3)",
                         ampc_dtype_name(c->cast_model_type));
    if ((u & AMPC_AMP_PROP_KEEP_BATCHNORM_FP32) || c->keep_batchnorm_fp32 != -1)
      return ampc__error(AMPC_EINVAL,
                         "amp: O1 runs batchnorm in f32 by its op policy, so keep_batchnorm_fp32 must not be set");
    if ((u & AMPC_AMP_PROP_MASTER_WEIGHTS) || c->master_weights != -1)
      return ampc__error(AMPC_EINVAL,
                         "amp: master_weights makes no sense with O1: the model weights themselves stay f32");
  }
  if (c->autocast && c->opt_level != AMPC_OPT_O1)
    return ampc__error(AMPC_EINVAL, "amp: autocast (patch_torch_functions) can only be on at O1, not %s", lvl);
  if (c->autocast != 0 && c->autocast != 1) return ampc__error(AMPC_EINVAL, "amp: autocast must be 0 or 1");

  /* ampc's own checks. */
  if (c->cast_model_type != AMPC_DTYPE_F32 && c->cast_model_type != c->half_type)
    return ampc__error(AMPC_EINVAL, "amp: cast_model_type %s differs from the half type %s (choose the half type "
                       "at init)", ampc_dtype_name(c->cast_model_type), ampc_dtype_name(c->half_type));
  if (!is_tristate(c->keep_batchnorm_fp32) || !is_tristate(c->master_weights))
    return ampc__error(AMPC_EINVAL, "amp: keep_batchnorm_fp32 and master_weights must be -1 (n/a), 0 or 1");
  if (c->loss_scale_dynamic != 0 && c->loss_scale_dynamic != 1)
    return ampc__error(AMPC_EINVAL, "amp: loss_scale_dynamic must be 0 or 1");
  if (!(c->loss_scale > 0) || !isfinite(c->loss_scale))
    return ampc__error(AMPC_EINVAL, "amp: loss_scale must be a positive finite number, not %g", (double)c->loss_scale);
  if (!c->loss_scale_dynamic && (u & AMPC_AMP_PROP_INIT_SCALE))
    return ampc__error(AMPC_EINVAL, "amp: init_scale applies to a dynamic loss scale, but loss_scale is static (%g)",
                       (double)c->loss_scale);
  if (!(c->min_loss_scale >= 0) || !isfinite(c->min_loss_scale))
    return ampc__error(AMPC_EINVAL, "amp: min_loss_scale must be a finite number >= 0, not %g",
                       (double)c->min_loss_scale);
  if (!(c->max_loss_scale > 0))
    return ampc__error(AMPC_EINVAL, "amp: max_loss_scale must be positive, not %g", (double)c->max_loss_scale);
  /* a scale below f32's smallest normal number has no finite 1/scale (the
   * gradients' unscaling), and the unset floor is that number */
  /* (a min_loss_scale of 0 is no floor) */
  const struct {
    const char *name;
    float v;
  } scales[] = {{"loss_scale", c->loss_scale}, {"min_loss_scale", c->min_loss_scale > 0 ? c->min_loss_scale : FLT_MIN},
                {"max_loss_scale", c->max_loss_scale}};
  for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
    if (scales[i].v < FLT_MIN)
      return ampc__error(AMPC_EINVAL, "amp: %s %g is below f32's smallest normal number 2^-126 (%g), where 1/scale overflows",
                         scales[i].name, (double)scales[i].v, (double)FLT_MIN);
  if (c->min_loss_scale > c->max_loss_scale)
    return ampc__error(AMPC_EINVAL, "amp: min_loss_scale %g is above max_loss_scale %g", (double)c->min_loss_scale,
                       (double)c->max_loss_scale);
  if (c->scale_window < 1) return ampc__error(AMPC_EINVAL, "amp: scale_window must be >= 1, not %d", c->scale_window);
  if (!(c->growth_factor > 1) || !isfinite(c->growth_factor))
    return ampc__error(AMPC_EINVAL, "amp: growth_factor must be a finite number > 1, not %g", (double)c->growth_factor);
  if (!(c->backoff_factor > 0 && c->backoff_factor < 1))
    return ampc__error(AMPC_EINVAL, "amp: backoff_factor must be in (0, 1), not %g", (double)c->backoff_factor);
  if (c->hysteresis < 1) return ampc__error(AMPC_EINVAL, "amp: hysteresis must be >= 1, not %d", c->hysteresis);
  if (c->consecutive_hysteresis != 0 && c->consecutive_hysteresis != 1)
    return ampc__error(AMPC_EINVAL, "amp: consecutive_hysteresis must be 0 or 1");
  if (c->num_losses < 1 || c->num_losses > AMP_MAX_LOSSES)
    return ampc__error(AMPC_EINVAL, "amp: num_losses must be >= 1 and <= %d, not %d", AMP_MAX_LOSSES, c->num_losses);
  return AMPC_OK;
}

int ampc_amp_config_uses_master_weights(const ampc_amp_config *c) {
  if (!c) return 0;
  return c->master_weights == 1 && c->cast_model_type != AMPC_DTYPE_F32;
}

ampc_dtype ampc_amp_config_batchnorm_type(const ampc_amp_config *c) {
  if (!c) return AMPC_DTYPE_F32;
  return c->keep_batchnorm_fp32 == 0 ? c->cast_model_type : AMPC_DTYPE_F32;
}

/* ---- describe ---- */

typedef struct {
  char *buf;
  size_t len, pos; /* pos counts what the whole line needs, beyond len too */
} line_buf;

static void put(line_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(line_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = b->pos < b->len ? b->len - b->pos : 0;
  int n = vsnprintf(room ? b->buf + b->pos : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) b->pos += (size_t)n;
}

static const char *tri_name(int v) { return v < 0 ? "n/a" : v ? "on" : "off"; }

/* "65536", "0.5"; an infinite value is "none". */
static void put_scale(line_buf *b, const char *key, float x) {
  if (isinf(x)) put(b, " %s=none", key);
  else put(b, " %s=%.9g", key, (double)x);
}

int ampc_amp_config_describe(const ampc_amp_config *c, char *buf, size_t len) {
  if (!c || (!buf && len)) return ampc__error(AMPC_EINVAL, "amp: describe: NULL argument");
  line_buf b = {buf, len, 0};
  if (len) buf[0] = '\0';
  const char *h = (unsigned)c->half_type < AMPC_DTYPE_COUNT ? ampc_dtype_name(c->half_type) : "?";
  switch (c->opt_level) {
  case AMPC_OPT_O0: put(&b, "O0 (pure f32 training):"); break;
  case AMPC_OPT_O1: put(&b, "O1 (%s casts around ops by the autocast policy, f32 weights):", h); break;
  case AMPC_OPT_O2:
  case AMPC_OPT_O3: /* what the level is with its overrides: O2's defaults, O3's, or a mix */
    if (c->keep_batchnorm_fp32 != 1 && c->master_weights != 1)
      put(&b, "O%d (pure %s training):", c->opt_level == AMPC_OPT_O2 ? 2 : 3, h);
    else
      put(&b, "O%d (%s training with %s batchnorm and %s master weights):", c->opt_level == AMPC_OPT_O2 ? 2 : 3, h,
          c->keep_batchnorm_fp32 == 1 ? "f32" : h, c->master_weights == 1 ? "f32" : "no");
    break;
  default: put(&b, "O? (invalid level %d):", (int)c->opt_level); break;
  }
  int f32_model = c->cast_model_type == AMPC_DTYPE_F32;
  put(&b, " half_type=%s cast_model_type=%s autocast=%s", h,
      (unsigned)c->cast_model_type < AMPC_DTYPE_COUNT ? ampc_dtype_name(c->cast_model_type) : "?",
      c->autocast ? "on" : "off");
  put(&b, " keep_batchnorm_fp32=%s%s", tri_name(c->keep_batchnorm_fp32),
      f32_model && c->keep_batchnorm_fp32 == 1 ? "(no effect: f32 model)" : "");
  put(&b, " master_weights=%s%s", tri_name(c->master_weights),
      f32_model && c->master_weights == 1 ? "(no effect: f32 model)" : "");
  if (c->loss_scale_dynamic) {
    put(&b, " loss_scale=dynamic");
    /* the scale the first step runs with: the ceiling bounds it (apex: min(max_loss_scale, 2^16)) */
    put_scale(&b, "init_scale", c->loss_scale < c->max_loss_scale ? c->loss_scale : c->max_loss_scale);
  } else {
    put_scale(&b, "loss_scale", c->loss_scale);
  }
  if (c->min_loss_scale > 0) put_scale(&b, "min_loss_scale", c->min_loss_scale);
  else put(&b, " min_loss_scale=none");
  put_scale(&b, "max_loss_scale", c->max_loss_scale);
  put(&b, " scale_window=%d growth_factor=%.9g backoff_factor=%.9g hysteresis=%d consecutive_hysteresis=%s"
          " num_losses=%d",
      c->scale_window, (double)c->growth_factor, (double)c->backoff_factor, c->hysteresis,
      c->consecutive_hysteresis ? "on" : "off", c->num_losses);
  put(&b, "; overrides:");
  int any = 0;
  for (size_t i = 0; i < NPROPS; i++)
    if (c->user_set & props[i].bit) put(&b, "%s%s", any++ ? "," : " ", props[i].name);
  if (!any) put(&b, " none");
  return b.pos > 2147483647u ? 2147483647 : (int)b.pos;
}
