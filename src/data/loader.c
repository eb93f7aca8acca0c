/* The batch loader: epoch order, pixel conversion, augmentation, prefetch.
 *
 * Batch k of an epoch holds the samples at positions [k*B, k*B + B) of that
 * epoch's order; everything random about a sample is drawn from (seed,
 * epoch, position), so any batch can be made by anyone at any time and come
 * out the same. That is what lets the background thread run ahead and lets a
 * run resume mid-epoch. With W ranks (the distributed sampler) batch k is
 * global, positions [k*W*B, (k+1)*W*B), and rank r fills its r-th slice: the
 * same samples, positions and augmentation one process gets at batch W*B.
 *
 * Background mode: a worker thread fills a ring of LOADER_SLOTS batch
 * buffers (batch k goes to slot k % LOADER_SLOTS), at most LOADER_SLOTS
 * batches ahead of the caller; ampc_loader_next waits for its slot and copies
 * it out. The worker never touches the slot the caller is copying from,
 * because it may only fill batches below pos + LOADER_SLOTS. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/rng.h"
#include "core/status_internal.h"
#include "data/data_internal.h"

#define LOADER_SLOTS 2
/* Padding beyond a few pixels only crops black; the CLI's batch limit. */
#define LOADER_MAX_PADDING 64
#define LOADER_MAX_BATCH 65536

typedef struct {
  int64_t batch; /* the batch index it holds, -1 for none */
  int n;
  void *x;    /* (B, C, H, W) of opts.dtype */
  int32_t *y; /* (B) */
} loader_slot;

struct ampc_loader {
  const ampc_dataset *d;
  ampc_loader_opts o;
  size_t elems;      /* C * H * W */
  size_t esize;      /* bytes per element of x */
  int64_t batches;   /* per epoch */
  float lut[3][256]; /* pixel byte -> value fed to the model, per channel */
  size_t *order;     /* (N) dataset index of each position in the epoch */
  int64_t epoch;     /* -1 before the first start_epoch */
  int64_t pos;       /* next batch the caller gets */
  float *scratch;    /* (C, H, W) for the caller's thread when x is not f32 */

  /* Background mode only; the fields below and epoch/pos/order are shared
   * with the worker under mu. order and epoch change only while the worker
   * is not filling (busy == 0) and restart holds it off. */
  int bg;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int quit, busy, restart;
  int64_t produce; /* next batch the worker fills */
  loader_slot slots[LOADER_SLOTS];
  float *wscratch; /* (C, H, W) for the worker */
};

void ampc_loader_opts_default(ampc_loader_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->batch_size = 128;
  o->shuffle = 1;
  o->seed = 0;
  o->drop_last = 0;
  o->normalize = 1;
  o->random_crop_padding = 0;
  o->hflip = 0;
  o->dtype = AMPC_DTYPE_F32;
  o->background = 1;
  o->rank = 0;
  o->world_size = 1;
}

/* Offsets use a multiply-shift of the top 32 bits (one draw per choice, so
 * the counter layout is fixed); the bias is below 2^-16 for P <= 2^15. */
void ampc__loader_aug_params(uint64_t seed, int64_t epoch, uint64_t pos, int padding,
                             int hflip, int *oy, int *ox, int *flip) {
  uint64_t key = ampc_rng_at(seed, AMPC_RNG_STREAM_AUGMENT, (uint64_t)epoch);
  uint64_t span = 2 * (uint64_t)padding + 1;
  *oy = *ox = *flip = 0;
  if (padding > 0) {
    *oy = (int)(((ampc_rng_at(key, AMPC_RNG_STREAM_AUGMENT, 3 * pos) >> 32) * span) >> 32);
    *ox = (int)(((ampc_rng_at(key, AMPC_RNG_STREAM_AUGMENT, 3 * pos + 1) >> 32) * span) >> 32);
  }
  if (hflip) *flip = (int)(ampc_rng_at(key, AMPC_RNG_STREAM_AUGMENT, 3 * pos + 2) >> 63);
}

/* The order of an epoch: identity, or a Fisher-Yates shuffle driven by a key
 * derived from (seed, epoch) alone. */
static void make_order(const ampc_loader *l, int64_t epoch, size_t *order) {
  size_t n = l->d->n;
  for (size_t i = 0; i < n; i++) order[i] = i;
  if (!l->o.shuffle || n < 2) return;
  uint64_t key = ampc_rng_at(l->o.seed, AMPC_RNG_STREAM_SHUFFLE, (uint64_t)epoch);
  ampc_rng r = ampc_rng_make(key, AMPC_RNG_STREAM_SHUFFLE);
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = (size_t)ampc_rng_below(&r, (uint64_t)i + 1);
    size_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

static void loader_make_order(ampc_loader *l, int64_t epoch) { make_order(l, epoch, l->order); }

ampc_status ampc_loader_epoch_order(const ampc_loader *l, int64_t epoch, size_t *out) {
  if (!l || !out) return ampc__error(AMPC_EINVAL, "ampc_loader_epoch_order: %s is NULL", l ? "out" : "loader");
  if (epoch < 0) return ampc__error(AMPC_EINVAL, "loader: epoch %lld is negative", (long long)epoch);
  make_order(l, epoch, out);
  return AMPC_OK;
}

/* One sample as torchvision's RandomCrop(H, padding=P) then
 * RandomHorizontalFlip then ToTensor (then Normalize) would make it: output
 * (y, x) reads the padded image at (y + oy, W-1-x + ox) if flipped, else
 * (y + oy, x + ox); padding is a black pixel, so it maps to lut[c][0]. */
static void loader_render(const ampc_loader *l, const uint8_t *img, int oy, int ox, int flip,
                          float *out) {
  const int C = l->d->c, H = l->d->h, W = l->d->w, P = l->o.random_crop_padding;
  for (int c = 0; c < C; c++) {
    const float *lut = l->lut[c];
    const float pad = lut[0];
    for (int y = 0; y < H; y++, out += W) {
      int sy = y + oy - P;
      if (sy < 0 || sy >= H) {
        for (int x = 0; x < W; x++) out[x] = pad;
        continue;
      }
      const uint8_t *row = img + ((size_t)c * H + (size_t)sy) * (size_t)W;
      if (!flip && ox == P) {
        for (int x = 0; x < W; x++) out[x] = lut[row[x]];
        continue;
      }
      for (int x = 0; x < W; x++) {
        int sx = (flip ? W - 1 - x : x) + ox - P;
        out[x] = sx >= 0 && sx < W ? lut[row[sx]] : pad;
      }
    }
  }
}

/* Makes batch k into x (B, C, H, W) and y (B); returns its sample count.
 * Reads only state that is fixed while it runs (see struct ampc_loader). */
/* This rank's slice of global batch k: positions [*start, *start + n). */
static size_t loader_slice(const ampc_loader *l, int64_t k, size_t *start) {
  const size_t B = (size_t)l->o.batch_size, W = (size_t)l->o.world_size, r = (size_t)l->o.rank, G = B * W;
  const size_t gstart = (size_t)k * G, gn = l->d->n - gstart < G ? l->d->n - gstart : G;
  if (gn == G) {
    *start = gstart + r * B;
    return B;
  }
  size_t lo = r * gn / W, hi = (r + 1) * gn / W;
  *start = gstart + lo;
  return hi - lo;
}

int64_t ampc_loader_global_samples(const ampc_loader *l, int64_t k) {
  if (!l) return 0;
  const size_t G = (size_t)l->o.batch_size * (size_t)l->o.world_size;
  if (k < 0 || k >= l->batches) return 0;
  size_t gstart = (size_t)k * G;
  return (int64_t)(l->d->n - gstart < G ? l->d->n - gstart : G);
}

static int loader_fill(const ampc_loader *l, int64_t k, void *x, int32_t *y, float *scratch) {
  const size_t B = (size_t)l->o.batch_size;
  size_t start;
  const size_t n = loader_slice(l, k, &start);
  const size_t bytes = l->elems * l->esize;
  for (size_t i = 0; i < n; i++) {
    size_t pos = start + i, idx = l->order[pos];
    int oy, ox, flip;
    ampc__loader_aug_params(l->o.seed, l->epoch, pos, l->o.random_crop_padding, l->o.hflip, &oy,
                            &ox, &flip);
    void *dst = (uint8_t *)x + i * bytes;
    float *f = l->o.dtype == AMPC_DTYPE_F32 ? (float *)dst : scratch;
    loader_render(l, l->d->images + idx * l->elems, oy, ox, flip, f);
    if (f != dst) ampc_store_f32(l->o.dtype, dst, f, l->elems);
    y[i] = l->d->labels[idx];
  }
  /* All-zero bits are +0 in f32, f16 and bf16. */
  memset((uint8_t *)x + n * bytes, 0, (B - n) * bytes);
  memset(y + n, 0, (B - n) * sizeof *y);
  return (int)n;
}

static int worker_has_work(const ampc_loader *l) {
  return l->epoch >= 0 && !l->restart && l->produce < l->batches &&
         l->produce < l->pos + LOADER_SLOTS;
}

static void *loader_worker(void *arg) {
  ampc_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->quit && !worker_has_work(l)) pthread_cond_wait(&l->cv, &l->mu);
    if (l->quit) break;
    int64_t k = l->produce;
    loader_slot *s = &l->slots[k % LOADER_SLOTS];
    l->busy = 1;
    pthread_mutex_unlock(&l->mu);
    int n = loader_fill(l, k, s->x, s->y, l->wscratch);
    pthread_mutex_lock(&l->mu);
    l->busy = 0;
    s->batch = k;
    s->n = n;
    l->produce = k + 1;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

ampc_status ampc_loader_create(ampc_loader **out, const ampc_dataset *d,
                               const ampc_loader_opts *o) {
  if (!out || !d || !o) return ampc__error(AMPC_EINVAL, "loader: out, d and o must not be NULL");
  *out = NULL;
  if (o->batch_size < 1)
    return ampc__error(AMPC_EINVAL, "loader: batch_size must be >= 1, got %d", o->batch_size);
  if (o->batch_size > LOADER_MAX_BATCH)
    return ampc__error(AMPC_EINVAL, "loader: batch_size must be at most %d, got %d", LOADER_MAX_BATCH, o->batch_size);
  if (o->random_crop_padding < 0 || o->random_crop_padding > LOADER_MAX_PADDING)
    return ampc__error(AMPC_EINVAL, "loader: random_crop_padding must be in [0, %d], got %d",
                       LOADER_MAX_PADDING, o->random_crop_padding);
  if (o->dtype != AMPC_DTYPE_F32 && o->dtype != AMPC_DTYPE_F16 && o->dtype != AMPC_DTYPE_BF16)
    return ampc__error(AMPC_EINVAL, "loader: dtype must be f32, f16 or bf16, got %s",
                       ampc_dtype_name(o->dtype));
  if (d->c < 1 || d->c > 3 || d->n < 1)
    return ampc__error(AMPC_EINVAL, "loader: dataset must have 1..3 channels and samples");
  if (o->world_size < 0 || o->world_size > (1 << 20))
    return ampc__error(AMPC_EINVAL, "loader: world_size %d outside 0..%d", o->world_size, 1 << 20);
  int W = o->world_size < 1 ? 1 : o->world_size;
  if (o->rank < 0 || o->rank >= W)
    return ampc__error(AMPC_EINVAL, "loader: rank %d outside 0..%d (world_size %d)", o->rank, W - 1, W);
  if ((size_t)o->batch_size * (size_t)W > SIZE_MAX / 4)
    return ampc__error(AMPC_EINVAL, "loader: a global batch of %d x %d samples is too large", W, o->batch_size);

  ampc_loader *l = calloc(1, sizeof *l);
  if (!l) return ampc__error(AMPC_ENOMEM, "loader: out of memory");
  l->d = d;
  l->o = *o;
  l->elems = (size_t)d->c * (size_t)d->h * (size_t)d->w;
  l->esize = ampc_dtype_size(o->dtype);
  l->epoch = -1;
  l->o.world_size = W;
  size_t B = (size_t)o->batch_size, G = B * (size_t)W;
  l->batches = (int64_t)(o->drop_last ? d->n / G : (d->n + G - 1) / G);

  float mean[3], std[3];
  ampc_dataset_norm(d, mean, std);
  for (int c = 0; c < d->c; c++) {
    for (int v = 0; v < 256; v++) {
      /* The same float operations as ToTensor's div(255) and Normalize's
       * sub(mean).div(std), so values match PyTorch's bit for bit. */
      float f = (float)v / 255.0f;
      l->lut[c][v] = o->normalize ? (f - mean[c]) / std[c] : f;
    }
  }

  int ok = l->elems <= SIZE_MAX / sizeof(float) / 4 &&
           B <= SIZE_MAX / 4 / (l->elems * sizeof(float));
  ok = ok && (l->order = malloc(d->n * sizeof *l->order)) != NULL;
  ok = ok && (l->scratch = malloc(l->elems * sizeof(float))) != NULL;
  if (ok && o->background) {
    ok = (l->wscratch = malloc(l->elems * sizeof(float))) != NULL;
    for (int i = 0; ok && i < LOADER_SLOTS; i++) {
      l->slots[i].batch = -1;
      ok = (l->slots[i].x = malloc(B * l->elems * l->esize)) != NULL &&
           (l->slots[i].y = malloc(B * sizeof(int32_t))) != NULL;
    }
    if (ok) {
      /* Without the thread the loader still works, synchronously, with the
       * same results; so failing to start one is not an error. */
      l->bg = pthread_mutex_init(&l->mu, NULL) == 0;
      if (l->bg && pthread_cond_init(&l->cv, NULL) != 0) {
        pthread_mutex_destroy(&l->mu);
        l->bg = 0;
      }
      if (l->bg && pthread_create(&l->thread, NULL, loader_worker, l) != 0) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        l->bg = 0;
      }
    }
  }
  if (!ok) {
    size_t elems = l->elems;
    ampc_loader_free(l);
    return ampc__error(AMPC_ENOMEM, "loader: out of memory for batches of %d x %zu elements",
                       o->batch_size, elems);
  }
  *out = l;
  return AMPC_OK;
}

void ampc_loader_free(ampc_loader *l) {
  if (!l) return;
  if (l->bg) {
    pthread_mutex_lock(&l->mu);
    l->quit = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
  }
  for (int i = 0; i < LOADER_SLOTS; i++) {
    free(l->slots[i].x);
    free(l->slots[i].y);
  }
  free(l->wscratch);
  free(l->scratch);
  free(l->order);
  free(l);
}

ampc_status ampc_loader_start_epoch(ampc_loader *l, int64_t epoch, int64_t start_batch) {
  if (!l) return ampc__error(AMPC_EINVAL, "loader: l must not be NULL");
  if (epoch < 0) return ampc__error(AMPC_EINVAL, "loader: epoch must be >= 0, got %lld",
                                    (long long)epoch);
  if (start_batch < 0 || start_batch > l->batches)
    return ampc__error(AMPC_EINVAL, "loader: start_batch %lld out of range [0, %lld]",
                       (long long)start_batch, (long long)l->batches);
  if (!l->bg) {
    loader_make_order(l, epoch);
    l->epoch = epoch;
    l->pos = start_batch;
    return AMPC_OK;
  }
  pthread_mutex_lock(&l->mu);
  l->restart = 1;
  while (l->busy) pthread_cond_wait(&l->cv, &l->mu);
  loader_make_order(l, epoch);
  l->epoch = epoch;
  l->pos = l->produce = start_batch;
  for (int i = 0; i < LOADER_SLOTS; i++) l->slots[i].batch = -1;
  l->restart = 0;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  return AMPC_OK;
}

ampc_status ampc_loader_next(ampc_loader *l, void *x, int32_t *y, int *n) {
  if (!l || !x || !y || !n) return ampc__error(AMPC_EINVAL, "loader: arguments must not be NULL");
  *n = 0;
  if (l->epoch < 0)
    return ampc__error(AMPC_ESTATE, "loader: call ampc_loader_start_epoch before ampc_loader_next");
  if (l->pos >= l->batches) return AMPC_OK;
  if (!l->bg) {
    *n = loader_fill(l, l->pos, x, y, l->scratch);
    l->pos++;
    return AMPC_OK;
  }
  loader_slot *s = &l->slots[l->pos % LOADER_SLOTS];
  pthread_mutex_lock(&l->mu);
  while (s->batch != l->pos) pthread_cond_wait(&l->cv, &l->mu);
  pthread_mutex_unlock(&l->mu);
  size_t B = (size_t)l->o.batch_size;
  memcpy(x, s->x, B * l->elems * l->esize);
  memcpy(y, s->y, B * sizeof *y);
  *n = s->n;
  pthread_mutex_lock(&l->mu);
  l->pos++;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  return AMPC_OK;
}

int64_t ampc_loader_batches_per_epoch(const ampc_loader *l) { return l ? l->batches : 0; }
int64_t ampc_loader_position(const ampc_loader *l) { return l ? l->pos : 0; }
int64_t ampc_loader_epoch(const ampc_loader *l) { return l ? l->epoch : -1; }
