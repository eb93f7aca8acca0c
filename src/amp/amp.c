/* The graph-facing half of amp: opt-level application, master weights,
 * gradient folding, and the training step in phases. The arithmetic runs in
 * the graph's backend over the flat parameter buckets; what stays here is
 * the policy: which buffers, which multiplier, whether to step. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ampc/amp.h"
#include "core/graph_internal.h"
#include "core/status_internal.h"
#include "dist/comm_internal.h"
#include "optim/optim_internal.h"

/* Data-parallel training: the gradients are averaged in buckets, each a run
 * of whole parameters [lo, hi) of one span, started as soon as backward has
 * finished all of its gradients. */
typedef struct {
  int span;                /* into ampc_amp.spans */
  size_t lo, hi;           /* flat elements */
  size_t pending;          /* elements whose gradients this backward has yet to finish */
  int state;               /* BUCKET_* */
  ampc__comm_req *req;
} grad_bucket;

enum { BUCKET_IDLE, BUCKET_FLIGHT, BUCKET_DONE };
/* where the step's gradients stand across the ranks */
enum { SYNC_LOCAL, SYNC_FLIGHT, SYNC_DONE };
/* DDP's defaults: buckets of 25 MB, the first of each span 1 MB */
#define AMP_BUCKET_BYTES ((size_t)25 << 20)
#define AMP_FIRST_BUCKET_BYTES ((size_t)1 << 20)
#define AMP_CHECK_EVERY 100

struct ampc_amp {
  ampc_amp_config cfg;
  ampc_graph *g;
  ampc_optim *opt;
  ampc__device *dev;
  ampc_comm *comm;
  ampc_scaler *scalers;
  ampc__span spans[AMPC__MAX_BUCKETS]; /* the model's buckets: its copy and own gradients */
  int nspans;
  size_t nparams, numel;
  size_t *ranges;              /* per parameter: flat start, n (for the overflow report) */
  const char **names;          /* per parameter */
  unsigned char *flags;        /* per parameter: a non-finite gradient (filled on overflow) */
  float *master;               /* device: f32 masters, or NULL */
  float *mgrad;                /* device: f32 gradients folded from the model's, or NULL */
  float *slots;                /* device: per loss {overflow in a fold, largest folded |g|} */
  float *slots_host;           /* their copy, read with the check */
  double *reduce;              /* host: the values the ranks reduce (2 + 2 * num_losses) */
  float clip;
  float loss_weight;
  int sr;
  uint64_t sr_seed;
  float st_max;

  /* data-parallel: a communicator of more than one rank */
  int ar_f32;                  /* 16-bit gradients all-reduced as an f32 sum (into rgrad) */
  int no_sync;                 /* backward leaves the gradients local (the step reduces them) */
  int zero;                    /* ZeRO stage 1: masters and optimizer state sharded */
  int sync_state;              /* SYNC_* */
  int gb_dirty;                /* the buckets must be made again (a setting changed) */
  size_t bucket_bytes;
  grad_bucket *gb;             /* the gradient buckets, made at first use */
  int ngb;
  size_t *counts;              /* per rank: blocks of a reduce-scatter or all-gather */
  float *rgrad;                /* device: f32 sums of the 16-bit gradients (flat), with ar_f32 */
  int rgrad_valid;             /* the step reads them */
  float *fold_slot;            /* device: 2 floats the bucket folds note into (not read) */
  size_t shard_lo, shard_hi;   /* ZeRO: this rank's flat elements */
  size_t *zranges;             /* ZeRO: per parameter, its part of the shard (start, n) */
  double *zflags;              /* ZeRO: per parameter, the overflow flags reduced across ranks */
  float *g_master, *g_state[3]; /* ZeRO: gathered full copies (ampc_amp_gather_state), or NULL */
  double *chk;                 /* the rank check's values (2 per loss scaler + 2) */
  int64_t steps_called;
  double t_first, t_last, t_exposed; /* the communication of the step in progress */
  ampc_amp_comm_stats cstats;
  const ampc__sync *bn_sync_set; /* what the graph was given for SyncBatchNorm */
  ampc__sync bn_sync;
};

static int dp(const ampc_amp *a) { return a->comm && a->comm->size > 1; }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A flat f32 array of the device indexed by the flat number though it holds
 * only elements [lo, ...): device memory, offset but never dereferenced. */
static float *flat_base(float *p, size_t lo) { return p ? (float *)((uintptr_t)p - lo * sizeof(float)) : NULL; }


/* apex's O1 lists (torch autocast's are close): matrix products in half;
 * norms, softmaxes, losses and reductions in fp32; element-wise ops promote. */
ampc_cast_policy ampc_amp_cast_policy(ampc_op_kind k) {
  switch (k) {
    case AMPC_OP_CONV2D:
    case AMPC_OP_LINEAR: return AMPC_CAST_POLICY_HALF;
    case AMPC_OP_BATCHNORM2D:
    case AMPC_OP_SOFTMAX:
    case AMPC_OP_LOG_SOFTMAX:
    case AMPC_OP_CROSS_ENTROPY:
    case AMPC_OP_GLOBAL_AVGPOOL: return AMPC_CAST_POLICY_FP32;
    case AMPC_OP_ADD: return AMPC_CAST_POLICY_PROMOTE;
    default: return AMPC_CAST_POLICY_KEEP;
  }
}

/* The masters start from the recorded f32 values, not their half copy (from
 * the model itself when those were released already). */
static ampc_status init_masters(ampc_amp *a) {
  ampc_graph *g = a->g;
  float *tmp = NULL;
  ampc_status s = AMPC_OK;
  for (size_t i = 0; i < a->nparams && s == 0; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    size_t off = a->ranges[2 * i], n = a->ranges[2 * i + 1];
    const float *w0 = ampc_graph_param_init(g, v);
    if (!w0) {
      float *t = realloc(tmp, n * sizeof *t);
      if (!t) {
        s = ampc__error(AMPC_ENOMEM, "amp: out of memory");
        break;
      }
      tmp = t;
      s = ampc_graph_read(g, v, tmp, AMPC_DTYPE_F32);
      w0 = tmp;
    }
    if (s == 0) s = ampc__dev_write(a->dev, a->master + off, AMPC_DTYPE_F32, w0, AMPC_DTYPE_F32, n);
  }
  free(tmp);
  return s;
}

ampc_status ampc_amp_initialize(ampc_amp **out, ampc_graph *g, ampc_optim *opt, const ampc_amp_config *cfg) {
  if (!out) return ampc__error(AMPC_EINVAL, "ampc_amp_initialize: out is NULL");
  *out = NULL;
  if (!g) return ampc__error(AMPC_EINVAL, "ampc_amp_initialize: graph is NULL");
  AMPC_TRY(ampc_amp_config_validate(cfg));
  if (ampc_graph_is_compiled(g))
    return ampc__error(AMPC_ESTATE, "amp: initialize the graph before it is compiled (the opt level decides its storage types)");
  ampc_graph_precision p = {
      .param_type = cfg->cast_model_type,
      .norm_param_type = ampc_amp_config_batchnorm_type(cfg),
      .act_type = cfg->cast_model_type,
      .autocast = cfg->autocast,
      .half_type = cfg->half_type,
      .policy = ampc_amp_cast_policy,
  };
  size_t numel = ampc_graph_param_numel(g);
  if (opt && ampc_optim_numel(opt) != numel)
    return ampc__error(AMPC_EINVAL, "amp: optimizer holds %zu values, the model has %zu parameters", ampc_optim_numel(opt), numel);
  AMPC_TRY(ampc_graph_set_precision(g, &p));
  AMPC_TRY(ampc_graph_compile(g));

  ampc_amp *a = calloc(1, sizeof *a);
  if (!a) return ampc__error(AMPC_ENOMEM, "amp: out of memory");
  a->cfg = *cfg;
  a->g = g;
  a->opt = opt;
  a->numel = numel;
  a->dev = ampc__device_ref(ampc__graph_device(g));
  a->nspans = ampc__graph_spans(g, a->spans);
  a->nparams = ampc_graph_param_count(g);
  size_t np = a->nparams ? a->nparams : 1, nl = (size_t)cfg->num_losses;
  a->ranges = calloc(2 * np, sizeof *a->ranges);
  a->names = calloc(np, sizeof *a->names);
  a->flags = calloc(np, 1);
  a->scalers = calloc(nl, sizeof *a->scalers);
  a->slots_host = calloc(2 * nl, sizeof *a->slots_host);
  a->reduce = calloc(2 + 2 * nl, sizeof *a->reduce);
  a->chk = calloc(2 * nl + 2, sizeof *a->chk);
  a->slots = ampc__dev_alloc(a->dev, 2 * nl * sizeof(float));
  int bad = !a->ranges || !a->names || !a->flags || !a->scalers || !a->slots_host || !a->reduce || !a->slots || !a->chk;
  for (size_t i = 0; !bad && i < a->nparams; i++) {
    ampc_value v = ampc_graph_param_at(g, i);
    ampc_tensor t = ampc_graph_tensor(g, v);
    a->ranges[2 * i] = ampc_graph_param_offset(g, v);
    a->ranges[2 * i + 1] = (size_t)ampc_tensor_numel(&t);
    a->names[i] = ampc_graph_name(g, v);
  }
  if (!bad && ampc_amp_config_uses_master_weights(cfg)) bad = !(a->master = ampc__dev_alloc(a->dev, numel * sizeof(float)));
  /* f32 gradients to fold into: needed with several losses (each unscaled by
   * its own scale); with master weights only once backward accumulates
   * (allocated then, see ampc_amp_backward) -- a single backward per step is
   * read straight from the model's gradients, converted as the step goes */
  if (!bad && cfg->num_losses > 1) bad = !(a->mgrad = ampc__dev_alloc(a->dev, numel * sizeof(float)));
  if (bad) {
    ampc_amp_free(a);
    return ampc__error(AMPC_ENOMEM, "amp: out of memory for %zu parameters", numel);
  }
  ampc_status s = a->master ? init_masters(a) : AMPC_OK;
  if (s == 0 && opt) s = ampc__optim_bind(opt, a->dev);
  if (s < 0) {
    ampc_amp_free(a);
    return s;
  }
  /* the graph holds its parameters now (and the masters their f32 values) */
  ampc_graph_release_init(g);
  for (int k = 0; k < cfg->num_losses; k++) ampc_scaler_init(&a->scalers[k], cfg);
  a->loss_weight = 1.0f;
  a->bucket_bytes = AMP_BUCKET_BYTES;
  *out = a;
  return AMPC_OK;
}

static void buckets_abandon(ampc_amp *a);

void ampc_amp_free(ampc_amp *a) {
  if (!a) return;
  buckets_abandon(a);
  if (a->bn_sync_set) ampc__graph_set_bn_sync(a->g, NULL);
  if (a->dev) {
    ampc__dev_free(a->dev, a->master);
    ampc__dev_free(a->dev, a->mgrad);
    ampc__dev_free(a->dev, a->slots);
    ampc__dev_free(a->dev, a->rgrad);
    ampc__dev_free(a->dev, a->fold_slot);
    ampc__dev_free(a->dev, a->g_master);
    for (int k = 0; k < 3; k++) ampc__dev_free(a->dev, a->g_state[k]);
    ampc__device_unref(a->dev);
  }
  free(a->gb);
  free(a->counts);
  free(a->zranges);
  free(a->zflags);
  free(a->chk);
  free(a->ranges);
  free(a->names);
  free(a->flags);
  free(a->scalers);
  free(a->slots_host);
  free(a->reduce);
  free(a);
}

const ampc_amp_config *ampc_amp_get_config(const ampc_amp *a) { return a ? &a->cfg : NULL; }
ampc_scaler *ampc_amp_scaler(ampc_amp *a, int loss_id) {
  return a && loss_id >= 0 && loss_id < a->cfg.num_losses ? &a->scalers[loss_id] : NULL;
}
int ampc_amp_has_master_weights(const ampc_amp *a) { return a && a->master != NULL; }
void ampc_amp_set_clip_grad_norm(ampc_amp *a, float max_norm) {
  if (a) a->clip = max_norm;
}
void ampc_amp_set_loss_weight(ampc_amp *a, float w) {
  if (a) a->loss_weight = w;
}
void ampc_amp_set_stochastic_rounding(ampc_amp *a, int on, uint64_t seed) {
  if (!a) return;
  a->sr = on;
  a->sr_seed = seed;
}
void ampc_amp_set_comm(ampc_amp *a, ampc_comm *c) {
  if (!a) return;
  a->comm = c;
  a->gb_dirty = 1;
}
void ampc_amp_set_allreduce_f32(ampc_amp *a, int on) {
  if (!a) return;
  a->ar_f32 = on != 0;
  a->gb_dirty = 1;
}
ampc_status ampc_amp_set_bucket_bytes(ampc_amp *a, size_t bytes) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_set_bucket_bytes: amp is NULL");
  if (bytes < 1024) return ampc__error(AMPC_EINVAL, "amp: gradient buckets of %zu bytes (at least 1024)", bytes);
  a->bucket_bytes = bytes;
  a->gb_dirty = 1;
  return AMPC_OK;
}
void ampc_amp_set_no_sync(ampc_amp *a, int on) {
  if (a) a->no_sync = on != 0;
}

/* ---- data-parallel: the gradient buckets ---- */

/* Each span's parameters from its end -- the last layers, whose gradients
 * backward finishes first -- in runs of about bucket_bytes (of the type they
 * travel in), the first run of a span at most 1 MB so that communication
 * starts early; a parameter is never split. */
static ampc_status build_buckets(ampc_amp *a) {
  free(a->gb);
  a->ngb = 0;
  a->gb = calloc(a->nparams + AMPC__MAX_BUCKETS, sizeof *a->gb);
  if (!a->gb) return ampc__error(AMPC_ENOMEM, "amp: out of memory");
  for (int sp = 0; sp < a->nspans; sp++) {
    const ampc__span *s = &a->spans[sp];
    size_t es = a->ar_f32 ? sizeof(float) : ampc_dtype_size(s->grad_type);
    size_t limit = a->bucket_bytes < AMP_FIRST_BUCKET_BYTES ? a->bucket_bytes : AMP_FIRST_BUCKET_BYTES;
    size_t hi = s->start + s->n, lo = hi;
    for (size_t i = a->nparams; i-- > 0;) {
      size_t off = a->ranges[2 * i];
      if (off < s->start || off >= s->start + s->n) continue;
      if (lo < hi && (hi - off) * es > limit) {
        a->gb[a->ngb++] = (grad_bucket){sp, lo, hi, 0, BUCKET_IDLE, NULL};
        hi = lo;
        limit = a->bucket_bytes;
      }
      lo = off;
    }
    if (lo < hi) a->gb[a->ngb++] = (grad_bucket){sp, lo, hi, 0, BUCKET_IDLE, NULL};
  }
  a->gb_dirty = 0;
  return AMPC_OK;
}

/* What data-parallel steps need, made once: the buckets, the per-rank
 * counts, the f32 sums of 16-bit gradients. */
static ampc_status dp_ready(ampc_amp *a) {
  if (a->gb_dirty || !a->gb) AMPC_TRY(build_buckets(a));
  if (!a->counts && !(a->counts = calloc((size_t)a->comm->size, sizeof *a->counts)))
    return ampc__error(AMPC_ENOMEM, "amp: out of memory");
  int half = 0;
  for (int i = 0; i < a->nspans; i++) half |= a->spans[i].grad_type != AMPC_DTYPE_F32;
  if (a->ar_f32 && half && !a->rgrad) {
    a->rgrad = ampc__dev_alloc(a->dev, (a->numel ? a->numel : 1) * sizeof(float));
    a->fold_slot = ampc__dev_alloc(a->dev, 2 * sizeof(float));
    if (!a->rgrad || !a->fold_slot) return ampc__error(AMPC_ENOMEM, "amp: out of memory for %zu f32 gradients", a->numel);
  }
  return AMPC_OK;
}

/* counts[r]: rank r's part of the flat range [lo, hi) (its ZeRO shard's). */
static const size_t *rank_counts(ampc_amp *a, size_t lo, size_t hi) {
  for (int r = 0; r < a->comm->size; r++) {
    size_t rlo, rhi;
    ampc__comm_block(a->numel, a->comm->size, r, &rlo, &rhi);
    size_t x = rlo > lo ? rlo : lo, y = rhi < hi ? rhi : hi;
    a->counts[r] = y > x ? y - x : 0;
  }
  return a->counts;
}

static ampc_status bucket_start(ampc_amp *a, grad_bucket *b) {
  const ampc__span *sp = &a->spans[b->span];
  size_t n = b->hi - b->lo, es = ampc_dtype_size(sp->grad_type);
  void *buf = (char *)sp->grad + (b->lo - sp->start) * es;
  ampc_dtype t = sp->grad_type;
  ampc__reduce_op op = AMPC__REDUCE_AVG;
  double t0 = now_s();
  if (a->mgrad) {
    buf = a->mgrad + b->lo;
    t = AMPC_DTYPE_F32;
  } else if (a->ar_f32 && a->rgrad && t != AMPC_DTYPE_F32) {
    /* the f32 sum: this rank's values over the size, into f32, then summed */
    ampc__span one = *sp;
    one.start = b->lo;
    one.n = n;
    one.model = NULL;
    one.grad = buf;
    AMPC_TRY(a->dev->be->fold(a->dev, &one, 1, a->rgrad, 1.0f / (float)a->comm->size, 0, a->fold_slot, 1.0f));
    buf = a->rgrad + b->lo;
    t = AMPC_DTYPE_F32;
    op = AMPC__REDUCE_SUM;
  }
  const size_t *counts = a->zero ? rank_counts(a, b->lo, b->hi) : NULL;
  if (a->t_first == 0.0) a->t_first = t0;
  ampc_status s = ampc__comm_ireduce(a->comm, a->dev, buf, t, n, counts, op, &b->req);
  double t1 = now_s();
  a->t_exposed += t1 - t0;
  if (s < 0) return s;
  a->cstats.bytes += (double)(n * ampc_dtype_size(t));
  b->state = b->req ? BUCKET_FLIGHT : BUCKET_DONE;
  if (!b->req) a->t_last = t1;
  return AMPC_OK;
}

/* Moves the collectives in flight forward (Open MPI progresses them only
 * inside its calls). */
static ampc_status buckets_progress(ampc_amp *a) {
  double t0 = now_s();
  for (int i = 0; i < a->ngb; i++) {
    grad_bucket *b = &a->gb[i];
    if (b->state != BUCKET_FLIGHT) continue;
    int done = 0;
    AMPC_TRY(ampc__comm_test(a->comm, b->req, &done));
    if (done) {
      b->state = BUCKET_DONE;
      b->req = NULL;
      a->t_last = now_s();
    }
  }
  a->t_exposed += now_s() - t0;
  return AMPC_OK;
}

/* Starts what has not started (in bucket order, as on every rank) and waits
 * for everything: the gradients are then averaged. */
static ampc_status buckets_finish(ampc_amp *a) {
  for (int i = 0; i < a->ngb; i++)
    if (a->gb[i].state == BUCKET_IDLE) AMPC_TRY(bucket_start(a, &a->gb[i]));
  double t0 = now_s();
  for (int i = 0; i < a->ngb; i++) {
    grad_bucket *b = &a->gb[i];
    if (b->state != BUCKET_FLIGHT) continue;
    AMPC_TRY(ampc__comm_wait(a->comm, b->req));
    b->state = BUCKET_DONE;
    b->req = NULL;
    a->t_last = now_s();
  }
  a->t_exposed += now_s() - t0;
  a->cstats.seconds += a->t_last > a->t_first ? a->t_last - a->t_first : 0.0;
  a->cstats.exposed_seconds += a->t_exposed;
  a->t_first = a->t_last = a->t_exposed = 0.0;
  a->rgrad_valid = a->ar_f32 && a->rgrad && !a->mgrad;
  a->sync_state = SYNC_DONE;
  return AMPC_OK;
}

/* For the next reduction: every bucket idle, every element pending. */
static void buckets_reset(ampc_amp *a) {
  for (int i = 0; i < a->ngb; i++) {
    a->gb[i].pending = a->gb[i].hi - a->gb[i].lo;
    a->gb[i].state = BUCKET_IDLE;
    a->gb[i].req = NULL;
  }
}

/* Collectives still in flight are completed (their buffers are about to go
 * away or be rewritten); errors no longer matter. */
static void buckets_abandon(ampc_amp *a) {
  for (int i = 0; a->comm && i < a->ngb; i++)
    if (a->gb[i].state == BUCKET_FLIGHT) ampc__comm_wait(a->comm, a->gb[i].req);
  buckets_reset(a);
}

/* backward's hook: a parameter's gradient is final. */
static ampc_status on_grad_ready(void *ctx, size_t start, size_t n) {
  ampc_amp *a = ctx;
  for (int i = 0; i < a->ngb; i++) {
    grad_bucket *b = &a->gb[i];
    if (start < b->lo || start >= b->hi) continue;
    b->pending -= n < b->pending ? n : b->pending;
    if (b->pending == 0 && b->state == BUCKET_IDLE) AMPC_TRY(bucket_start(a, b));
    break;
  }
  return buckets_progress(a);
}

ampc_status ampc_amp_sync_grads(ampc_amp *a) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_sync_grads: amp is NULL");
  if (!dp(a) || a->sync_state == SYNC_DONE) return AMPC_OK;
  AMPC_TRY(dp_ready(a));
  if (a->sync_state == SYNC_LOCAL) buckets_reset(a);
  return buckets_finish(a);
}

void ampc_amp_get_comm_stats(ampc_amp *a, ampc_amp_comm_stats *st, int reset) {
  if (!a || !st) return;
  *st = a->cstats;
  st->buckets = a->ngb;
  if (reset) memset(&a->cstats, 0, sizeof a->cstats);
}

/* ---- data-parallel: ZeRO-1 and the rank check ---- */

ampc_status ampc_amp_set_zero(ampc_amp *a, int stage) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_set_zero: amp is NULL");
  if (stage != 0 && stage != 1) return ampc__error(AMPC_EINVAL, "amp: ZeRO stage %d (0 or 1)", stage);
  if (stage == a->zero) return AMPC_OK;
  if (stage == 0) return ampc__error(AMPC_ESTATE, "amp: the masters and optimizer state are sharded already");
  if (!a->opt) return ampc__error(AMPC_ESTATE, "amp: ZeRO shards an optimizer's state: there is none");
  if (!dp(a)) return AMPC_OK; /* one rank holds it all */
  size_t lo, hi;
  ampc__comm_block(a->numel, a->comm->size, a->comm->rank, &lo, &hi);
  size_t n = hi - lo, np = a->nparams ? a->nparams : 1;
  size_t *zr = malloc(2 * np * sizeof *zr);
  double *zf = malloc(np * sizeof *zf);
  float *m = a->master ? ampc__dev_alloc(a->dev, (n ? n : 1) * sizeof(float)) : NULL;
  ampc_status s = zr && zf && (m || !a->master) ? AMPC_OK : ampc__error(AMPC_ENOMEM, "amp: out of memory");
  if (s == 0 && m) s = ampc__dev_copy(a->dev, m, a->master + lo, n * sizeof(float));
  if (s == 0) s = ampc__optim_shard(a->opt, lo, n);
  if (s < 0) {
    free(zr), free(zf);
    if (m) ampc__dev_free(a->dev, m);
    return s;
  }
  if (m) {
    ampc__dev_free(a->dev, a->master);
    a->master = m;
  }
  for (size_t i = 0; i < a->nparams; i++) {
    size_t off = a->ranges[2 * i], end = off + a->ranges[2 * i + 1];
    size_t x = off > lo ? off : lo, y = end < hi ? end : hi;
    zr[2 * i] = y > x ? x : off;
    zr[2 * i + 1] = y > x ? y - x : 0;
  }
  a->zranges = zr;
  a->zflags = zf;
  a->shard_lo = lo;
  a->shard_hi = hi;
  a->zero = 1;
  a->gb_dirty = 1;
  return AMPC_OK;
}

int ampc_amp_zero_stage(const ampc_amp *a) { return a ? a->zero : 0; }

/* SyncBatchNorm's sums: batch norm's statistics pass hands them over
 * between its two passes. */
static ampc_status bn_sum(void *ctx, double *v, size_t n) {
  ampc_amp *a = ctx;
  return a->comm->ops->allreduce_host(a->comm, v, n, AMPC__REDUCE_SUM);
}

ampc_status ampc_amp_set_sync_batchnorm(ampc_amp *a, int on) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_set_sync_batchnorm: amp is NULL");
  /* a device whose batch norm cannot hand its sums over (cuda, so far) */
  if (on && dp(a) && !a->dev->be->sync_batchnorm)
    return ampc__error(AMPC_EUNSUPPORTED, "SyncBatchNorm: not implemented on the %s device (its batch norm keeps per-rank statistics)",
                       a->dev->be->name);
  a->bn_sync = (ampc__sync){bn_sum, a};
  /* one rank's batch is the global batch: nothing to synchronise */
  a->bn_sync_set = on && dp(a) ? &a->bn_sync : NULL;
  ampc__graph_set_bn_sync(a->g, a->bn_sync_set);
  return AMPC_OK;
}

ampc_status ampc_amp_gather_state(ampc_amp *a) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_gather_state: amp is NULL");
  if (!a->zero) return AMPC_OK;
  AMPC_TRY(dp_ready(a));
  size_t n = a->shard_hi - a->shard_lo, ns = ampc_optim_state_count(a->opt);
  const size_t *counts = rank_counts(a, 0, a->numel);
  for (size_t k = 0; k <= ns; k++) {
    /* k < ns: optimizer state k; k == ns: the masters */
    float **dst = k < ns ? &a->g_state[k] : &a->g_master;
    const float *src = k < ns ? ampc__optim_state_base(a->opt, k) : a->master;
    if (!src) continue;
    if (!*dst && !(*dst = ampc__dev_alloc(a->dev, (a->numel ? a->numel : 1) * sizeof(float))))
      return ampc__error(AMPC_ENOMEM, "amp: out of memory gathering %zu values", a->numel);
    AMPC_TRY(ampc__dev_copy(a->dev, *dst + a->shard_lo, src, n * sizeof(float)));
    AMPC_TRY(ampc__comm_allgather(a->comm, a->dev, *dst, AMPC_DTYPE_F32, counts));
  }
  return AMPC_OK;
}

void ampc_amp_release_state(ampc_amp *a) {
  if (!a) return;
  ampc__dev_free(a->dev, a->g_master);
  a->g_master = NULL;
  for (int k = 0; k < 3; k++) {
    ampc__dev_free(a->dev, a->g_state[k]);
    a->g_state[k] = NULL;
  }
}

ampc_status ampc_amp_check_ranks(ampc_amp *a) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_check_ranks: amp is NULL");
  if (!dp(a)) return AMPC_OK;
  int nl = a->cfg.num_losses;
  double *v = a->chk;
  for (int k = 0; k < nl; k++) {
    v[2 * k] = ampc_scaler_scale(&a->scalers[k]);
    v[2 * k + 1] = -v[2 * k];
  }
  v[2 * nl] = a->opt ? (double)ampc_optim_step_count(a->opt) : 0.0;
  v[2 * nl + 1] = -v[2 * nl];
  AMPC_TRY(a->comm->ops->allreduce_host(a->comm, v, 2 * (size_t)nl + 2, AMPC__REDUCE_MAX));
  for (int k = 0; k < nl; k++)
    if (v[2 * k] != -v[2 * k + 1])
      return ampc__error(AMPC_ESTATE, "amp: the ranks have diverged: loss scale %d is %g on one rank and %g on another (rank %d has %g)",
                         k, -v[2 * k + 1], v[2 * k], a->comm->rank, (double)ampc_scaler_scale(&a->scalers[k]));
  if (v[2 * nl] != -v[2 * nl + 1])
    return ampc__error(AMPC_ESTATE, "amp: the ranks have diverged: optimizer step %.0f on one rank and %.0f on another", -v[2 * nl + 1],
                       v[2 * nl]);
  return AMPC_OK;
}

ampc_status ampc_amp_forward(ampc_amp *a, int training) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_forward: amp is NULL");
  return ampc_graph_forward(a->g, training);
}

/* The gradients the step reads: the f32 ones folded into, or the model's. */
static int grad_spans(const ampc_amp *a, ampc__span *out) {
  if (!a->mgrad) {
    memcpy(out, a->spans, (size_t)a->nspans * sizeof *out);
    /* 16-bit gradients all-reduced as f32 sums: the step reads those */
    for (int i = 0; a->rgrad_valid && i < a->nspans; i++)
      if (out[i].grad_type != AMPC_DTYPE_F32) {
        out[i].grad_type = AMPC_DTYPE_F32;
        out[i].grad = a->rgrad + out[i].start;
      }
    return a->nspans;
  }
  for (int i = 0; i < a->nspans; i++) {
    out[i] = a->spans[i];
    out[i].grad_type = AMPC_DTYPE_F32;
    out[i].grad = a->mgrad + a->spans[i].start;
  }
  return a->nspans;
}

/* mgrad (+)= f * the model's gradients, noting an overflow and the largest
 * magnitude in the loss's slot. */
static ampc_status fold(ampc_amp *a, float f, int accumulate, int loss_id, float scale) {
  return a->dev->be->fold(a->dev, a->spans, a->nspans, a->mgrad, f, accumulate, a->slots + 2 * loss_id, scale);
}

ampc_status ampc_amp_backward(ampc_amp *a, ampc_value loss, int loss_id, int accumulate) {
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_backward: amp is NULL");
  if (loss_id < 0 || loss_id >= a->cfg.num_losses)
    return ampc__error(AMPC_EINVAL, "amp: loss id %d outside 0..%d (num_losses=%d)", loss_id, a->cfg.num_losses - 1, a->cfg.num_losses);
  float scale = ampc_scaler_scale(&a->scalers[loss_id]);
  /* a previous backward's reductions complete before this one writes (an
   * accumulating backward then adds to averaged gradients: averaging the
   * sum again is right, as DDP's is) */
  if (dp(a) && a->sync_state == SYNC_FLIGHT) AMPC_TRY(buckets_finish(a));
  if (!a->mgrad && accumulate && a->master) {
    /* the first accumulating backward: from now on gradients add up in f32,
     * starting from the ones the model holds */
    a->mgrad = ampc__dev_alloc(a->dev, (a->numel ? a->numel : 1) * sizeof(float));
    if (!a->mgrad) return ampc__error(AMPC_ENOMEM, "amp: out of memory for %zu f32 gradients", a->numel);
    AMPC_TRY(fold(a, 1.0f, 0, loss_id, scale));
  }
  if (!a->mgrad && dp(a) && !a->no_sync) {
    /* overlap: each bucket's all-reduce starts once backward has finished
     * its gradients, while backward goes on */
    AMPC_TRY(dp_ready(a));
    buckets_reset(a);
    a->rgrad_valid = 0;
    a->sync_state = SYNC_FLIGHT;
    ampc__graph_set_grad_hook(a->g, on_grad_ready, a);
    ampc_status s = ampc_graph_backward(a->g, loss, scale * a->loss_weight, accumulate);
    ampc__graph_set_grad_hook(a->g, NULL, NULL);
    /* parameters this loss does not reach: their buckets start now */
    for (int i = 0; s == 0 && i < a->ngb; i++)
      if (a->gb[i].state == BUCKET_IDLE) s = bucket_start(a, &a->gb[i]);
    if (s < 0) {
      buckets_abandon(a);
      a->sync_state = SYNC_LOCAL;
    }
    return s;
  }
  a->sync_state = SYNC_LOCAL;
  a->rgrad_valid = 0;
  if (!a->mgrad) return ampc_graph_backward(a->g, loss, scale * a->loss_weight, accumulate);
  /* backward writes only the parameters this loss reaches: the others must
   * read zero, not the previous backward's gradient, when they are folded */
  AMPC_TRY(ampc_graph_zero_grad(a->g));
  AMPC_TRY(ampc_graph_backward(a->g, loss, scale * a->loss_weight, 0));
  /* Fold the model's gradients into the f32 ones. With several losses each is
   * unscaled by its own scale now; with one, the unscale waits for step(). */
  return fold(a, a->cfg.num_losses > 1 ? 1.0f / scale : 1.0f, accumulate, loss_id, scale);
}

/* What the step multiplies the gradients by to unscale them: with several
 * losses each was unscaled as it was folded; with one, it happens here. */
static float step_unscale(const ampc_amp *a) {
  return a->mgrad && a->cfg.num_losses > 1 ? 1.0f : ampc_scaler_inv_scale(&a->scalers[0]);
}

ampc_status ampc_amp_unscaled_grads(ampc_amp *a, float *out, int *found_inf) {
  if (!a || !out) return ampc__error(AMPC_EINVAL, "ampc_amp_unscaled_grads: %s is NULL", a ? "out" : "amp");
  ampc__span s[AMPC__MAX_BUCKETS];
  int ns = grad_spans(a, s);
  float gmul = step_unscale(a);
  int bad = 0;
  for (int i = 0; i < ns; i++) {
    float *dst = out + s[i].start;
    AMPC_TRY(ampc__dev_read(a->dev, dst, AMPC_DTYPE_F32, s[i].grad, s[i].grad_type, s[i].n));
    for (size_t e = 0; e < s[i].n; e++) {
      dst[e] *= gmul;
      if (!isfinite(dst[e])) bad = 1;
    }
  }
  if (found_inf) *found_inf = bad;
  return AMPC_OK;
}

static ampc_status clear_grads(ampc_amp *a) {
  a->sync_state = SYNC_LOCAL;
  a->rgrad_valid = 0;
  AMPC_TRY(ampc_graph_zero_grad(a->g));
  if (a->mgrad) AMPC_TRY(ampc__dev_set(a->dev, a->mgrad, 0, a->numel * sizeof(float)));
  return ampc__dev_set(a->dev, a->slots, 0, 2 * (size_t)a->cfg.num_losses * sizeof(float));
}

/* This rank's share of spans s for the check: flat elements [lo, hi). */
static int clip_spans(const ampc__span *s, int ns, size_t lo, size_t hi, ampc__span *out) {
  int k = 0;
  for (int i = 0; i < ns; i++) {
    size_t a = s[i].start > lo ? s[i].start : lo, b = s[i].start + s[i].n < hi ? s[i].start + s[i].n : hi;
    if (a >= b) continue;
    size_t skip = a - s[i].start;
    out[k] = s[i];
    out[k].start = a;
    out[k].n = b - a;
    if (out[k].model) out[k].model = (char *)out[k].model + skip * ampc_dtype_size(s[i].type);
    out[k].grad = (const char *)out[k].grad + skip * ampc_dtype_size(s[i].grad_type);
    k++;
  }
  return k;
}

/* Phases 2-3 of the step (see ampc/comm.h): the check over this rank's
 * share, the overflow flags and the norm reduced. */
static ampc_status check_phase(ampc_amp *a, const ampc__span *s, int ns, float gmul, ampc__check *chk) {
  /* the largest magnitude for the grad stats: here, or (with f32 gradients)
   * as they were folded */
  int nl = a->cfg.num_losses, want_max = !a->mgrad;
  ampc__span share[AMPC__MAX_BUCKETS];
  int nshare = ns;
  const ampc__span *cs = s;
  if (dp(a)) {
    /* the gradients are averaged (phase 1, ampc_amp_step); this rank checks
     * its share, which with ZeRO-1 is its shard: the part it has reduced */
    size_t lo, hi;
    ampc__comm_block(a->numel, a->comm->size, a->comm->rank, &lo, &hi);
    nshare = clip_spans(s, ns, lo, hi, share);
    cs = share;
  }
  AMPC_TRY(a->dev->be->check(a->dev, cs, nshare, gmul, want_max, a->slots, 2 * nl, a->slots_host, chk));
  a->dev->reads++;
  if (a->comm && a->comm->size > 1) {
    double *m = a->reduce;
    m[0] = chk->found_inf;
    m[1] = chk->max_abs;
    for (int k = 0; k < 2 * nl; k++) m[2 + k] = a->slots_host[k];
    AMPC_TRY(a->comm->ops->allreduce_host(a->comm, m, 2 + 2 * (size_t)nl, AMPC__REDUCE_MAX));
    chk->found_inf = m[0] != 0.0;
    chk->max_abs = (float)m[1];
    for (int k = 0; k < 2 * nl; k++) a->slots_host[k] = (float)m[2 + k];
    AMPC_TRY(a->comm->ops->allreduce_host(a->comm, &chk->sumsq, 1, AMPC__REDUCE_SUM));
  }
  return AMPC_OK;
}

ampc_status ampc_amp_step(ampc_amp *a, float lr, ampc_amp_step_info *info) {
  ampc_amp_step_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  if (!a) return ampc__error(AMPC_EINVAL, "ampc_amp_step: amp is NULL");
  if (!a->opt) return ampc__error(AMPC_ESTATE, "amp: step without an optimizer");
  if (!(lr >= 0.0f) || !isfinite(lr)) return ampc__error(AMPC_EINVAL, "amp: learning rate %g", lr);
  if (dp(a)) {
    /* phase 1: the gradients averaged across the ranks (overlapped with
     * backward, or all now) */
    AMPC_TRY(dp_ready(a));
    if (a->sync_state == SYNC_LOCAL) buckets_reset(a);
    if (a->sync_state != SYNC_DONE) AMPC_TRY(buckets_finish(a));
    a->cstats.steps++;
  }
  ampc__span s[AMPC__MAX_BUCKETS];
  int ns = grad_spans(a, s);
  float unscale = step_unscale(a);
  ampc__check chk;
  AMPC_TRY(check_phase(a, s, ns, unscale, &chk));
  int nl = a->cfg.num_losses, found = chk.found_inf, flagged = 0;
  for (int k = 0; k < nl; k++) {
    found |= a->slots_host[2 * k] != 0.0f;
    flagged |= a->slots_host[2 * k] != 0.0f;
    if (a->slots_host[2 * k + 1] > a->st_max) a->st_max = a->slots_host[2 * k + 1];
  }
  if (isfinite(chk.max_abs) && chk.max_abs > a->st_max) a->st_max = chk.max_abs;
  if (found) {
    /* an overflowing step's largest gradient is unknown but at least what
     * overflows the half type at this scale: counted as that, so the
     * statistic does not leave out the very steps it is about */
    int f16 = a->cfg.half_type == AMPC_DTYPE_F16 && (a->cfg.cast_model_type == AMPC_DTYPE_F16 || a->cfg.autocast);
    float at_least = (f16 ? 65504.0f : FLT_MAX) * unscale;
    if (isfinite(at_least) && at_least > a->st_max) a->st_max = at_least;
  }
  info->found_inf = found;
  ampc__span sh[AMPC__MAX_BUCKETS];
  int nsh = a->zero ? clip_spans(s, ns, a->shard_lo, a->shard_hi, sh) : 0;
  if (found && a->zero) {
    /* which parameters overflowed: each rank knows its shard's */
    AMPC_TRY(a->dev->be->nonfinite(a->dev, sh, nsh, a->zranges, a->nparams, unscale, a->flags));
    a->dev->reads++;
    for (size_t i = 0; i < a->nparams; i++) a->zflags[i] = a->flags[i];
    AMPC_TRY(a->comm->ops->allreduce_host(a->comm, a->zflags, a->nparams, AMPC__REDUCE_MAX));
    for (size_t i = 0; i < a->nparams; i++) a->flags[i] = a->zflags[i] != 0.0;
  } else if (found) {
    /* which parameters overflowed: a second pass, on skipped steps only */
    AMPC_TRY(a->dev->be->nonfinite(a->dev, s, ns, a->ranges, a->nparams, unscale, a->flags));
    a->dev->reads++;
  }
  if (found) {
    for (size_t i = 0; i < a->nparams; i++)
      if (a->flags[i]) {
        if (info->n_nonfinite < AMPC_AMP_MAX_REPORTED) info->nonfinite[info->n_nonfinite] = a->names[i];
        info->n_nonfinite++;
      }
  }
  /* phase 4: the scalers. Each loss's backs off for its own overflow; an
   * overflow no loss owns (the folded sum itself) backs all of them off */
  int apply = !found;
  for (int k = 0; k < nl; k++) {
    int inf_k = nl > 1 ? (a->slots_host[2 * k] != 0.0f || (found && !flagged)) : found;
    if (!ampc_scaler_update(&a->scalers[k], inf_k)) apply = 0;
  }
  info->scale = ampc_scaler_scale(&a->scalers[0]);
  info->clip_coef = ampc_clip_coef(found ? INFINITY : chk.sumsq, a->clip, &info->grad_norm);
  if (apply) {
    /* phase 5: the optimizer on the masters (writing the model copy) or on
     * the model itself */
    ampc__update u;
    int64_t step_no = ampc_optim_step_count(a->opt);
    ampc__optim_begin_step(a->opt, lr, &u);
    u.master = a->master;
    u.gmul = unscale * info->clip_coef;
    u.sr = a->sr && !a->master;
    u.sr_seed = a->sr_seed;
    u.sr_base = (uint64_t)step_no * a->numel;
    if (a->zero) {
      /* ZeRO-1: this rank's shard, then every rank's weights to all */
      u.master = flat_base(a->master, a->shard_lo);
      AMPC_TRY(a->dev->be->update(a->dev, sh, nsh, &u));
      for (int i = 0; i < a->nspans; i++)
        AMPC_TRY(ampc__comm_allgather(a->comm, a->dev, a->spans[i].model, a->spans[i].type,
                                      rank_counts(a, a->spans[i].start, a->spans[i].start + a->spans[i].n)));
    } else {
      AMPC_TRY(a->dev->be->update(a->dev, s, ns, &u));
    }
    info->applied = 1;
  }
  AMPC_TRY(clear_grads(a));
  /* a rank whose scaler or step count drifted is an error, found within
   * AMP_CHECK_EVERY steps (every rank counts its calls alike) */
  if (dp(a) && ++a->steps_called % AMP_CHECK_EVERY == 0) AMPC_TRY(ampc_amp_check_ranks(a));
  return AMPC_OK;
}

/* ---- values in and out ---- */

/* With ZeRO-1 a rank holds the masters and optimizer state of its shard
 * only: reads outside it need ampc_amp_gather_state first, writes keep the
 * part inside it. */
static ampc_status zero_gathered(const ampc_amp *a, const float *gathered, size_t off, size_t n, const char *what) {
  if (gathered || (off >= a->shard_lo && off + n <= a->shard_hi)) return AMPC_OK;
  return ampc__error(AMPC_ESTATE, "amp: with ZeRO-1 rank %d holds the %s of elements [%zu, %zu) only: gather them first (ampc_amp_gather_state)",
                     a->comm->rank, what, a->shard_lo, a->shard_hi);
}

/* The part of [off, off + n) in this rank's shard: [*x, *y). */
static int in_shard(const ampc_amp *a, size_t off, size_t n, size_t *x, size_t *y) {
  *x = off > a->shard_lo ? off : a->shard_lo;
  *y = off + n < a->shard_hi ? off + n : a->shard_hi;
  return *y > *x;
}

ampc_status ampc_amp_param_values(ampc_amp *a, float *out) {
  if (!a || !out) return ampc__error(AMPC_EINVAL, "ampc_amp_param_values: %s is NULL", a ? "out" : "amp");
  if (a->master && a->zero) {
    AMPC_TRY(zero_gathered(a, a->g_master, 0, a->numel, "master weights"));
    return ampc__dev_read(a->dev, out, AMPC_DTYPE_F32, a->g_master, AMPC_DTYPE_F32, a->numel);
  }
  if (a->master) return ampc__dev_read(a->dev, out, AMPC_DTYPE_F32, a->master, AMPC_DTYPE_F32, a->numel);
  for (int i = 0; i < a->nspans; i++)
    AMPC_TRY(ampc__dev_read(a->dev, out + a->spans[i].start, AMPC_DTYPE_F32, a->spans[i].model, a->spans[i].type, a->spans[i].n));
  return AMPC_OK;
}

ampc_status ampc_amp_load_params(ampc_amp *a, const float *values) {
  if (!a || !values) return ampc__error(AMPC_EINVAL, "ampc_amp_load_params: %s is NULL", a ? "values" : "amp");
  for (int i = 0; i < a->nspans; i++)
    AMPC_TRY(ampc__dev_write(a->dev, a->spans[i].model, a->spans[i].type, values + a->spans[i].start, AMPC_DTYPE_F32, a->spans[i].n));
  size_t x = 0, y = a->numel;
  if (a->zero && !in_shard(a, 0, a->numel, &x, &y)) return AMPC_OK;
  if (a->master)
    AMPC_TRY(ampc__dev_write(a->dev, a->master + (x - a->shard_lo), AMPC_DTYPE_F32, values + x, AMPC_DTYPE_F32, y - x));
  if (a->g_master) AMPC_TRY(ampc__dev_write(a->dev, a->g_master, AMPC_DTYPE_F32, values, AMPC_DTYPE_F32, a->numel));
  return AMPC_OK;
}

/* The flat range of the parameter called name, checked against n. */
static ampc_status param_range(const ampc_amp *a, const char *name, size_t n, size_t *off) {
  for (size_t i = 0; i < a->nparams; i++)
    if (name && strcmp(a->names[i], name) == 0) {
      if (n != a->ranges[2 * i + 1])
        return ampc__error(AMPC_EINVAL, "amp: parameter '%s' has %zu values, not %zu", name, a->ranges[2 * i + 1], n);
      *off = a->ranges[2 * i];
      return AMPC_OK;
    }
  return ampc__error(AMPC_ENOTFOUND, "amp: no parameter named '%s'", name ? name : "");
}

static ampc_status master_range(const ampc_amp *a, const char *name, size_t n, size_t *off) {
  if (!a->master) return ampc__error(AMPC_ESTATE, "amp: no master weights at %s", ampc_opt_level_name(a->cfg.opt_level));
  return param_range(a, name, n, off);
}

ampc_status ampc_amp_read_master(const ampc_amp *a, const char *name, float *dst, size_t n) {
  if (!a || !dst || !name) return ampc__error(AMPC_EINVAL, "ampc_amp_read_master: %s is NULL", !a ? "amp" : !dst ? "dst" : "name");
  size_t off;
  AMPC_TRY(master_range(a, name, n, &off));
  if (!a->zero) return ampc__dev_read(a->dev, dst, AMPC_DTYPE_F32, a->master + off, AMPC_DTYPE_F32, n);
  AMPC_TRY(zero_gathered(a, a->g_master, off, n, "master weights"));
  const float *src = a->g_master ? a->g_master + off : a->master + (off - a->shard_lo);
  return ampc__dev_read(a->dev, dst, AMPC_DTYPE_F32, src, AMPC_DTYPE_F32, n);
}

ampc_status ampc_amp_write_master(ampc_amp *a, const char *name, const float *src, size_t n) {
  if (!a || !src || !name) return ampc__error(AMPC_EINVAL, "ampc_amp_write_master: %s is NULL", !a ? "amp" : !src ? "src" : "name");
  size_t off, x, y;
  AMPC_TRY(master_range(a, name, n, &off));
  if (!a->zero) return ampc__dev_write(a->dev, a->master + off, AMPC_DTYPE_F32, src, AMPC_DTYPE_F32, n);
  if (a->g_master) AMPC_TRY(ampc__dev_write(a->dev, a->g_master + off, AMPC_DTYPE_F32, src, AMPC_DTYPE_F32, n));
  if (!in_shard(a, off, n, &x, &y)) return AMPC_OK;
  return ampc__dev_write(a->dev, a->master + (x - a->shard_lo), AMPC_DTYPE_F32, src + (x - off), AMPC_DTYPE_F32, y - x);
}

static ampc_status state_at(const ampc_amp *a, const char *state, const char *name, size_t n, size_t *k, size_t *off) {
  if (!a->opt) return ampc__error(AMPC_ESTATE, "amp: no optimizer");
  AMPC_TRY(ampc_optim_state_index(a->opt, state, k));
  return param_range(a, name, n, off);
}

ampc_status ampc_amp_read_optim_state(const ampc_amp *a, const char *state, const char *name, float *dst, size_t n) {
  if (!a || !dst || !state || !name)
    return ampc__error(AMPC_EINVAL, "ampc_amp_read_optim_state: %s is NULL", !a ? "amp" : !dst ? "dst" : !state ? "state" : "name");
  size_t k, off;
  AMPC_TRY(state_at(a, state, name, n, &k, &off));
  if (!a->zero) return ampc_optim_state_read(a->opt, k, off, n, dst);
  AMPC_TRY(zero_gathered(a, a->g_state[k], off, n, "optimizer state"));
  if (a->g_state[k]) return ampc__dev_read(a->dev, dst, AMPC_DTYPE_F32, a->g_state[k] + off, AMPC_DTYPE_F32, n);
  return ampc_optim_state_read(a->opt, k, off, n, dst);
}

ampc_status ampc_amp_write_optim_state(ampc_amp *a, const char *state, const char *name, const float *src, size_t n) {
  if (!a || !src || !state || !name)
    return ampc__error(AMPC_EINVAL, "ampc_amp_write_optim_state: %s is NULL", !a ? "amp" : !src ? "src" : !state ? "state" : "name");
  size_t k, off, x, y;
  AMPC_TRY(state_at(a, state, name, n, &k, &off));
  if (!a->zero) return ampc_optim_state_write(a->opt, k, off, n, src);
  if (a->g_state[k]) AMPC_TRY(ampc__dev_write(a->dev, a->g_state[k] + off, AMPC_DTYPE_F32, src, AMPC_DTYPE_F32, n));
  if (!in_shard(a, off, n, &x, &y)) return AMPC_OK;
  return ampc_optim_state_write(a->opt, k, x, y - x, src + (x - off));
}

/* ---- statistics and memory ---- */

void ampc_amp_set_grad_stats(ampc_amp *a, int on) {
  if (a) ampc__graph_count_underflow(a->g, on);
}

void ampc_amp_get_grad_stats(ampc_amp *a, ampc_amp_grad_stats *st, int reset) {
  if (!a || !st) return;
  /* the underflow count comes from the kernels, which see each weight gradient
   * in f32 before it is rounded to its storage type */
  ampc_backend_stats bs;
  a->dev->be->stats(a->dev, &bs, reset ? AMPC__STATS_GRADS : 0);
  st->values = bs.grad_values;
  st->underflow = bs.grad_underflow;
  st->max_abs = a->st_max;
  if (reset) a->st_max = 0.0f;
}

void ampc_amp_memory(const ampc_amp *a, ampc_mem_report *r) {
  if (r && !a) memset(r, 0, sizeof *r);
  if (!a || !r) return;
  ampc_graph_memory(a->g, r);
  /* with ZeRO-1, this rank's shard of the masters and the optimizer state */
  size_t held = a->zero ? a->shard_hi - a->shard_lo : a->numel;
  if (a->master) r->bytes[AMPC_MEM_MASTER_WEIGHTS][AMPC_DTYPE_F32] += held * sizeof(float);
  if (a->mgrad) r->bytes[AMPC_MEM_GRADIENTS][AMPC_DTYPE_F32] += a->numel * sizeof(float);
  if (a->rgrad) r->bytes[AMPC_MEM_GRADIENTS][AMPC_DTYPE_F32] += a->numel * sizeof(float);
  if (a->opt) r->bytes[AMPC_MEM_OPTIMIZER_STATE][AMPC_DTYPE_F32] += ampc_optim_state_count(a->opt) * ampc__optim_state_numel(a->opt) * sizeof(float);
}
