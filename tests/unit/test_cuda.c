/* The cuda backend. Built always: where ampc has no CUDA, or the machine no
 * GPU, the cases that need a device print a note and pass, and the no-device
 * error is checked instead. In the host-emulation build (test_cuda_emu,
 * AMPC_CUDA_EMU) every case runs, on the backend's own code with its kernels
 * on host threads.
 *
 * - a missing device gives one clear line (library and CLI);
 * - type conversions through write/read give the cpu backend's bits;
 * - the step's passes: the optimizer update (SGD, Adam, AdamW; f32 masters
 *   writing f16/bf16 copies; stochastic rounding) gives the cpu backend's
 *   bits -- the same step_math.h text on both; the check's flag, maximum and
 *   sum of squares, folding and the non-finite report agree with the cpu's;
 * - a label out of range is an error at the next read, and the next batch
 *   runs;
 * - a few training steps of the cnn at O0, O2 f16 and O2 bf16, and of
 *   ResNet-18 at O2 f16, follow the cpu backend's to the precision's tolerance, allocate no device memory after
 *   the first step and synchronise once a step;
 * - CUDA graphs give the same bits as kernel-by-kernel launches;
 * - a checkpoint saved on cuda loads on the cpu with the same values. */
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>

#include "ampc/ampc.h"
#include "backend/backend.h"
#include "test.h"

/* the cuda backend's counts of synchronisations and of CUDA graphs */
#ifdef AMPC__BACKEND_CUDA
extern int64_t ampc__cu_syncs, ampc__cu_graph_captures, ampc__cu_graph_launches;
#else
static int64_t ampc__cu_syncs, ampc__cu_graph_captures, ampc__cu_graph_launches; /* (never counted: no backend) */
#endif

/* NULL when the cuda backend can run here, else why not (printed once). */
static const char *unavailable(void) {
  static int checked;
  static char why[512];
  if (!checked) {
    checked = 1;
    if (ampc_backend_check("cuda") < 0) snprintf(why, sizeof why, "%s", ampc_last_error());
  }
  return why[0] ? why : NULL;
}
#define NEED_DEVICE()                                                  \
  do {                                                                 \
    if (unavailable()) {                                               \
      printf("note: skipped, no CUDA device here (%s)\n", unavailable()); \
      return;                                                          \
    }                                                                  \
  } while (0)

static ampc__device *device(const char *name) {
  ampc__device *d = NULL;
  CHECK_OK(ampc__device_create(&d, name, NULL));
  return d;
}

static float urand(uint64_t stream, uint64_t i, float lo, float hi) {
  return lo + (hi - lo) * (float)(ampc_rng_at(77, stream, i) >> 40) * (1.0f / 16777216.0f);
}

/* ---------------- the no-device error ---------------- */

TEST(no_device_error_is_one_line) {
  if (!unavailable()) {
    printf("note: a CUDA device is present: the no-device error is not checked here\n");
    return;
  }
  const char *msg = unavailable();
  CHECK_MSG(!strchr(msg, '\n'), "one line: %s", msg);
#ifdef AMPC__BACKEND_CUDA
  CHECK_MSG(strncmp(msg, "backend cuda: no CUDA device (cudaGetDeviceCount: ", 50) == 0, "message: %s", msg);
#else
  CHECK_MSG(strstr(msg, "ampc was built without CUDA") != NULL, "message: %s", msg);
#endif
#ifdef AMPC_CLI_PATH
  /* the command line: one "ampc: error:" line naming the flag, exit status 1 */
  char cmd[1024], out[2048] = "";
  snprintf(cmd, sizeof cmd, "%s train --device cuda --epochs 1 --train-limit 64 2>&1", AMPC_CLI_PATH);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  if (!p) return;
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status %d: %s", st, out);
  CHECK_MSG(strncmp(out, "ampc: error: --device: ", 23) == 0 && strchr(out, '\n') == out + strlen(out) - 1, "output: %s", out);
#endif
}

/* ---------------- conversions ---------------- */

TEST(conversions_give_the_cpu_bits) {
  NEED_DEVICE();
  ampc__device *cpu = device("cpu"), *cu = device("cuda");
  if (!cpu || !cu) return;
  enum { N = 4096 };
  static float src[N];
  static const uint32_t special[] = {0x7f800001u, 0xff812345u, 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x00000001u,
                                     0x80000007u, 0x33000000u, 0x477ff000u, 0x477fefffu, 0x387fe000u, 0x7f7fffffu};
  for (int i = 0; i < N; i++) {
    uint32_t u = (uint32_t)(ampc_rng_at(5, 1, (uint64_t)i) >> 32);
    if (i < (int)(sizeof special / sizeof special[0])) u = special[i];
    memcpy(&src[i], &u, 4);
  }
  static const ampc_dtype types[] = {AMPC_DTYPE_F32, AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++) {
      ampc_dtype dt = types[a], rt = types[b];
      void *pc = ampc__dev_alloc(cpu, N * 4), *pg = ampc__dev_alloc(cu, N * 4);
      static unsigned char oc[N * 4], og[N * 4];
      CHECK_OK(ampc__dev_write(cpu, pc, dt, src, AMPC_DTYPE_F32, N));
      CHECK_OK(ampc__dev_write(cu, pg, dt, src, AMPC_DTYPE_F32, N));
      CHECK_OK(ampc__dev_read(cpu, oc, rt, pc, dt, N));
      CHECK_OK(ampc__dev_read(cu, og, rt, pg, dt, N));
      CHECK_MSG(memcmp(oc, og, N * ampc_dtype_size(rt)) == 0, "f32 -> %s -> %s differs from the cpu's", ampc_dtype_name(dt),
                ampc_dtype_name(rt));
      ampc__dev_free(cpu, pc);
      ampc__dev_free(cu, pg);
    }
  /* integers: i64 that do not fit i32 are refused, as on the cpu */
  int64_t big[2] = {1, (int64_t)1 << 40};
  void *pi = ampc__dev_alloc(cu, 8);
  CHECK_ERR(ampc__dev_write(cu, pi, AMPC_DTYPE_I32, big, AMPC_DTYPE_I64, 2), AMPC_ERANGE, "does not fit i32");
  ampc__dev_free(cu, pi);
  /* fresh memory is zero */
  void *z = ampc__dev_alloc(cu, 1000);
  unsigned char zb[1000];
  CHECK_OK(ampc__dev_read(cu, zb, AMPC_DTYPE_U8, z, AMPC_DTYPE_U8, 1000));
  int nz = 0;
  for (int i = 0; i < 1000; i++) nz += zb[i] != 0;
  CHECK_MSG(nz == 0, "%d bytes of fresh device memory are not zero", nz);
  ampc__dev_free(cu, z);
  ampc__device_unref(cpu);
  ampc__device_unref(cu);
}

/* ---------------- the step's passes ---------------- */

enum { N16 = 5000, N32 = 3003, NT = N16 + N32 };

/* One device's copy of a flat state: an f16/bf16 bucket and an f32 one. */
typedef struct {
  ampc__device *d;
  void *model16, *model32, *grad16, *grad32;
  float *master, *state[3], *fold, *slot;
} flat;

static void flat_make(flat *f, const char *name, ampc_dtype half, int nan_at) {
  memset(f, 0, sizeof *f);
  f->d = device(name);
  if (!f->d) return;
  ampc__device *d = f->d;
  static float w[NT], g[NT], s[3][NT];
  for (int i = 0; i < NT; i++) {
    w[i] = urand(1, (uint64_t)i, -1.0f, 1.0f);
    g[i] = urand(2, (uint64_t)i, -0.02f, 0.02f) * (i % 97 == 0 ? 100.0f : 1.0f);
    for (int k = 0; k < 3; k++) s[k][i] = k ? urand(3 + (uint64_t)k, (uint64_t)i, 0.0f, 1e-4f) : urand(3, (uint64_t)i, -0.01f, 0.01f);
  }
  if (nan_at >= 0) g[nan_at] = nan_at % 2 ? INFINITY : NAN;
  f->model16 = ampc__dev_alloc(d, N16 * 2);
  f->grad16 = ampc__dev_alloc(d, N16 * 2);
  f->model32 = ampc__dev_alloc(d, N32 * 4);
  f->grad32 = ampc__dev_alloc(d, N32 * 4);
  f->master = ampc__dev_alloc(d, NT * 4);
  f->fold = ampc__dev_alloc(d, NT * 4);
  f->slot = ampc__dev_alloc(d, 2 * 4);
  CHECK_OK(ampc__dev_write(d, f->model16, half, w, AMPC_DTYPE_F32, N16));
  CHECK_OK(ampc__dev_write(d, f->grad16, half, g, AMPC_DTYPE_F32, N16));
  CHECK_OK(ampc__dev_write(d, f->model32, AMPC_DTYPE_F32, w + N16, AMPC_DTYPE_F32, N32));
  CHECK_OK(ampc__dev_write(d, f->grad32, AMPC_DTYPE_F32, g + N16, AMPC_DTYPE_F32, N32));
  CHECK_OK(ampc__dev_write(d, f->master, AMPC_DTYPE_F32, w, AMPC_DTYPE_F32, NT));
  CHECK_OK(ampc__dev_write(d, f->fold, AMPC_DTYPE_F32, s[0], AMPC_DTYPE_F32, NT));
  for (int k = 0; k < 3; k++) {
    f->state[k] = ampc__dev_alloc(d, NT * 4);
    CHECK_OK(ampc__dev_write(d, f->state[k], AMPC_DTYPE_F32, s[k], AMPC_DTYPE_F32, NT));
  }
}

static int flat_spans(const flat *f, ampc_dtype half, ampc__span *s) {
  s[0] = (ampc__span){0, N16, half, f->model16, half, f->grad16};
  s[1] = (ampc__span){N16, N32, AMPC_DTYPE_F32, f->model32, AMPC_DTYPE_F32, f->grad32};
  return 2;
}

static void flat_free(flat *f) {
  if (!f->d) return;
  void *ps[] = {f->model16, f->model32, f->grad16, f->grad32, f->master, f->fold, f->slot, f->state[0], f->state[1], f->state[2]};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) ampc__dev_free(f->d, ps[i]);
  ampc__device_unref(f->d);
}

/* every buffer of the flat state, as stored */
static void flat_compare(const flat *a, const flat *b, ampc_dtype half, const char *what) {
  static unsigned char x[NT * 4], y[NT * 4];
  struct {
    const char *name;
    void *pa, *pb;
    size_t n;
    ampc_dtype t;
  } bufs[] = {{"model16", a->model16, b->model16, N16, half}, {"model32", a->model32, b->model32, N32, AMPC_DTYPE_F32},
              {"master", a->master, b->master, NT, AMPC_DTYPE_F32},    {"state0", a->state[0], b->state[0], NT, AMPC_DTYPE_F32},
              {"state1", a->state[1], b->state[1], NT, AMPC_DTYPE_F32}, {"state2", a->state[2], b->state[2], NT, AMPC_DTYPE_F32},
              {"fold", a->fold, b->fold, NT, AMPC_DTYPE_F32},          {"slot", a->slot, b->slot, 2, AMPC_DTYPE_F32}};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    CHECK_OK(ampc__dev_read(a->d, x, bufs[i].t, bufs[i].pa, bufs[i].t, bufs[i].n));
    CHECK_OK(ampc__dev_read(b->d, y, bufs[i].t, bufs[i].pb, bufs[i].t, bufs[i].n));
    size_t es = ampc_dtype_size(bufs[i].t), bad = 0, first = 0;
    for (size_t e = 0; e < bufs[i].n; e++)
      if (memcmp(x + e * es, y + e * es, es) != 0 && bad++ == 0) first = e;
    CHECK_MSG(bad == 0, "%s: %s: %zu of %zu elements differ from the cpu's (first %zu)", what, bufs[i].name, bad, bufs[i].n, first);
  }
}

static ampc__update make_update(ampc_optim_kind kind, int variant, const flat *f) {
  ampc__update u;
  memset(&u, 0, sizeof u);
  u.kind = kind;
  ampc__optim_consts *k = &u.k;
  float lr = 0.01f;
  if (kind == AMPC_OPTIM_SGD) {
    k->neg_lr = -lr;
    k->weight_decay = variant & 1 ? 1e-4f : 0.0f;
    k->momentum = 0.9f;
    k->one_minus_dampening = 1.0f;
    k->nesterov = variant & 2 ? 1 : 0;
    k->first = variant & 4 ? 1 : 0;
    u.state[0] = f->state[0];
  } else {
    double t = 3.0;
    k->decoupled = kind == AMPC_OPTIM_ADAMW;
    k->amsgrad = variant & 1;
    k->weight_decay = 0.01f;
    k->decay = (float)(1.0 - (double)lr * 0.01);
    k->beta1 = 0.9f;
    k->one_minus_beta1 = (float)(1.0 - 0.9);
    k->beta2 = 0.999f;
    k->one_minus_beta2 = (float)(1.0 - 0.999);
    k->neg_step_size = (float)(-(double)lr / (1.0 - pow(0.9, t)));
    k->bias_correction2_sqrt = (float)sqrt(1.0 - pow(0.999, t));
    k->eps = 1e-8f;
    for (int i = 0; i < 3; i++) u.state[i] = f->state[i];
    if (!k->amsgrad) u.state[2] = NULL;
  }
  u.master = variant & 8 ? NULL : f->master;
  u.gmul = 1.0f / 1024.0f;
  u.sr = variant & 16 ? 1 : 0;
  u.sr_seed = 9;
  u.sr_base = 12345;
  return u;
}

TEST(update_gives_the_cpu_bits) {
  NEED_DEVICE();
  static const ampc_dtype halves[] = {AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  static const ampc_optim_kind kinds[] = {AMPC_OPTIM_SGD, AMPC_OPTIM_ADAM, AMPC_OPTIM_ADAMW};
  /* variants: bit 0 weight decay / amsgrad, 1 nesterov, 2 first step, 3 no masters, 4 stochastic rounding */
  static const int variants[] = {0, 1, 3, 4, 8, 8 | 16, 1 | 8 | 16};
  for (int h = 0; h < 2; h++)
    for (int k = 0; k < 3; k++)
      for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        if (kinds[k] != AMPC_OPTIM_SGD && (variants[v] & 6)) continue;
        flat a, b;
        flat_make(&a, "cpu", halves[h], -1);
        flat_make(&b, "cuda", halves[h], -1);
        if (a.d && b.d) {
          ampc__span sa[2], sb[2];
          int ns = flat_spans(&a, halves[h], sa);
          flat_spans(&b, halves[h], sb);
          for (int step = 0; step < 2; step++) {
            ampc__update ua = make_update(kinds[k], variants[v], &a), ub = make_update(kinds[k], variants[v], &b);
            CHECK_OK(a.d->be->update(a.d, sa, ns, &ua));
            CHECK_OK(b.d->be->update(b.d, sb, ns, &ub));
          }
          char what[96];
          snprintf(what, sizeof what, "%s %s variant %d", ampc_optim_kind_name(kinds[k]), ampc_dtype_name(halves[h]), variants[v]);
          flat_compare(&a, &b, halves[h], what);
        }
        flat_free(&a);
        flat_free(&b);
      }
}

TEST(check_fold_nonfinite_agree_with_cpu) {
  NEED_DEVICE();
  static const int plant[] = {-1, 17, 4444, 6001};
  for (int h = 0; h < 2; h++)
    for (int p = 0; p < 4; p++) {
      ampc_dtype half = h ? AMPC_DTYPE_BF16 : AMPC_DTYPE_F16;
      flat a, b;
      flat_make(&a, "cpu", half, plant[p]);
      flat_make(&b, "cuda", half, plant[p]);
      if (a.d && b.d) {
        ampc__span sa[2], sb[2];
        int ns = flat_spans(&a, half, sa);
        flat_spans(&b, half, sb);
        ampc__check ca, cb;
        float slots[2] = {0.0f, 0.0f}, sla[2], slb[2];
        CHECK_OK(ampc__dev_write(a.d, a.slot, AMPC_DTYPE_F32, slots, AMPC_DTYPE_F32, 2));
        CHECK_OK(ampc__dev_write(b.d, b.slot, AMPC_DTYPE_F32, slots, AMPC_DTYPE_F32, 2));
        for (int acc = 0; acc < 2; acc++) {
          CHECK_OK(a.d->be->fold(a.d, sa, ns, a.fold, 0.5f, acc, a.slot, 3.0f));
          CHECK_OK(b.d->be->fold(b.d, sb, ns, b.fold, 0.5f, acc, b.slot, 3.0f));
        }
        for (int want_max = 0; want_max < 2; want_max++) {
          CHECK_OK(a.d->be->check(a.d, sa, ns, 0.25f, want_max, a.slot, 2, sla, &ca));
          CHECK_OK(b.d->be->check(b.d, sb, ns, 0.25f, want_max, b.slot, 2, slb, &cb));
          CHECK_MSG(ca.found_inf == cb.found_inf && ca.found_inf == (plant[p] >= 0), "plant %d: found_inf %d vs %d", plant[p],
                    ca.found_inf, cb.found_inf);
          CHECK_MSG(ca.max_abs == cb.max_abs, "plant %d: max %g vs %g", plant[p], (double)ca.max_abs, (double)cb.max_abs);
          if (plant[p] < 0)
            CHECK_MSG(fabs(ca.sumsq - cb.sumsq) <= 1e-12 * ca.sumsq, "sum of squares %.17g vs %.17g", ca.sumsq, cb.sumsq);
          CHECK_MSG(memcmp(sla, slb, sizeof sla) == 0, "plant %d: slots %g %g vs %g %g", plant[p], (double)sla[0],
                    (double)sla[1], (double)slb[0], (double)slb[1]);
        }
        size_t ranges[8] = {0, 100, 100, 4900, 5000, 1001, 6001, 2002};
        unsigned char fa[4] = {9, 9, 9, 9}, fb[4] = {7, 7, 7, 7};
        CHECK_OK(a.d->be->nonfinite(a.d, sa, ns, ranges, 4, 0.25f, fa));
        CHECK_OK(b.d->be->nonfinite(b.d, sb, ns, ranges, 4, 0.25f, fb));
        CHECK_MSG(memcmp(fa, fb, 4) == 0, "plant %d: non-finite flags %d%d%d%d vs %d%d%d%d", plant[p], fa[0], fa[1], fa[2], fa[3],
                  fb[0], fb[1], fb[2], fb[3]);
        flat_compare(&a, &b, half, "fold");
      }
      flat_free(&a);
      flat_free(&b);
    }
}

/* ---------------- a label out of range ---------------- */

TEST(label_out_of_range_is_an_error) {
  NEED_DEVICE();
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape2(4, 10));
  float w0[10 * 10];
  for (int i = 0; i < 100; i++) w0[i] = urand(9, (uint64_t)i, -0.3f, 0.3f);
  ampc_value w = ampc_graph_param(g, "w", ampc_shape2(10, 10), 0, w0);
  ampc_value y = ampc_graph_labels(g, "y", 4);
  ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, x, w, AMPC_VALUE_NONE), y, 0.0f);
  CHECK_OK(ampc_graph_set_backend(g, "cuda", NULL));
  CHECK_OK(ampc_graph_compile(g));
  float xs[40];
  for (int i = 0; i < 40; i++) xs[i] = urand(10, (uint64_t)i, -1.0f, 1.0f);
  CHECK_OK(ampc_graph_write(g, x, xs, AMPC_DTYPE_F32));
  int32_t bad[4] = {0, 1, 12, -1}, good[4] = {0, 1, 2, 3};
  CHECK_OK(ampc_graph_write(g, y, bad, AMPC_DTYPE_I32));
  float l = 0.0f;
  /* found by the kernel, reported by the next call that waits for the device */
  ampc_status s = ampc_graph_forward(g, 1);
  if (s == 0) s = ampc_graph_read(g, loss, &l, AMPC_DTYPE_F32);
  CHECK_MSG(s == AMPC_ERANGE && strstr(ampc_last_error(), "label 12 of sample 2 out of range for 10 classes"), "got %d: %s", s,
            ampc_last_error());
  CHECK_OK(ampc_graph_write(g, y, good, AMPC_DTYPE_I32));
  CHECK_OK(ampc_graph_forward(g, 1));
  CHECK_OK(ampc_graph_read(g, loss, &l, AMPC_DTYPE_F32));
  CHECK_MSG(isfinite(l) && l > 0.0f, "loss %g after good labels", (double)l);
  ampc_graph_free(g);
}

/* ---------------- training steps ---------------- */

enum { STEPS = 4, BATCH = 6 };

typedef struct {
  ampc_model *m;
  ampc_graph *g;
  ampc_optim *opt;
  ampc_amp *amp;
} rig;

static int rig_make_opts(rig *r, const char *backend, const ampc_backend_opts *bo, const char *model, ampc_opt_level lvl,
                         ampc_dtype half) {
  memset(r, 0, sizeof *r);
  int resnet = strcmp(model, "resnet18") == 0;
  ampc_model_opts mo = {.batch = BATCH, .channels = resnet ? 3 : 1, .height = resnet ? 8 : 12, .width = resnet ? 8 : 12,
                        .classes = 10, .seed = 4};
  CHECK_OK(ampc_model_create(&r->m, model, &mo));
  if (!r->m) return 0;
  r->g = ampc_model_graph(r->m);
  CHECK_OK(ampc_graph_set_backend(r->g, backend, bo));
  /* SGD: an update in proportion to the gradient, so that the two backends'
   * parameters differ by as little as their gradients (Adam's update of a
   * gradient that is rounding noise has a size of its own) */
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_SGD);
  oc.lr = resnet ? 0.002f : 0.05f; /* (ResNet-18 on batches of 6 is unstable at higher rates) */
  oc.momentum = 0.9f;
  CHECK_OK(ampc_optim_create(&r->opt, &oc, ampc_graph_param_numel(r->g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, lvl, half));
  /* a static scale: no step may overflow on one backend and not the other */
  if (lvl != AMPC_OPT_O0) CHECK_OK(ampc_amp_config_set(&ac, "loss_scale", "128"));
  CHECK_OK(ampc_amp_initialize(&r->amp, r->g, r->opt, &ac));
  return r->amp != NULL;
}

static int rig_make(rig *r, const char *backend, const char *model, ampc_opt_level lvl, ampc_dtype half) {
  return rig_make_opts(r, backend, NULL, model, lvl, half);
}

static void rig_free(rig *r) {
  ampc_amp_free(r->amp);
  ampc_optim_free(r->opt);
  ampc_model_free(r->m);
}

static void write_batch(rig *r, uint64_t seed) {
  ampc_tensor x = ampc_graph_tensor(r->g, ampc_model_input(r->m));
  size_t n = (size_t)ampc_tensor_numel(&x);
  float *v = malloc(n * sizeof *v);
  int32_t y[BATCH];
  ampc_rng rng = ampc_rng_make(seed, AMPC_RNG_STREAM_USER);
  for (size_t i = 0; i < n; i++) v[i] = ampc_rng_normal(&rng);
  for (int i = 0; i < BATCH; i++) y[i] = (int32_t)ampc_rng_below(&rng, 10);
  CHECK_OK(ampc_graph_write(r->g, ampc_model_input(r->m), v, AMPC_DTYPE_F32));
  CHECK_OK(ampc_graph_write(r->g, ampc_model_labels(r->m), y, AMPC_DTYPE_I32));
  free(v);
}

TEST(training_steps_follow_the_cpu) {
  NEED_DEVICE();
  /* the cnn: batch norm with its ReLU and 2x2 pool fused; ResNet-18: the
   * residual adds with theirs, strided and 1x1 convolutions, the global pool */
  /* (ResNet-18 on batches of 6 is chaotic: its batch norms at 1x1 see 6
   * values a channel; in f32 two backends part after 3 steps, and in f16
   * the cpu's own two convolution algorithms give gradients as far apart
   * as the cpu's and cuda's after one step: one step is compared) */
  static const struct {
    const char *model;
    ampc_opt_level lvl;
    ampc_dtype half;
    double tol;
    int steps;
  } cases[] = {{"cnn", AMPC_OPT_O0, AMPC_DTYPE_F16, 2e-4, STEPS},
               {"cnn", AMPC_OPT_O2, AMPC_DTYPE_F16, 2e-2, STEPS},
               {"cnn", AMPC_OPT_O2, AMPC_DTYPE_BF16, 6e-2, STEPS},
               {"resnet18", AMPC_OPT_O2, AMPC_DTYPE_F16, 5e-3, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    rig r[2];
    float loss[2][STEPS];
    float *vals[2] = {NULL, NULL};
    int ok = rig_make(&r[0], "cpu", cases[c].model, cases[c].lvl, cases[c].half) &&
             rig_make(&r[1], "cuda", cases[c].model, cases[c].lvl, cases[c].half);
    for (int b = 0; ok && b < 2; b++) {
      int64_t reserved = 0;
      for (int s = 0; s < cases[c].steps; s++) {
        write_batch(&r[b], 50 + (uint64_t)s);
        ampc_backend_stats st;
        ampc_graph_backend_stats(r[b].g, &st, 1);
        int64_t syncs = ampc__cu_syncs;
        CHECK_OK(ampc_amp_forward(r[b].amp, 1));
        CHECK_OK(ampc_amp_backward(r[b].amp, ampc_model_loss(r[b].m), 0, 0));
        CHECK_OK(ampc_amp_step(r[b].amp, ampc_optim_get_config(r[b].opt)->lr, NULL));
        syncs = ampc__cu_syncs - syncs;
        ampc_graph_backend_stats(r[b].g, &st, 0);
        CHECK_MSG(st.reads == 1, "%s step %d: %lld reads from the device", b ? "cuda" : "cpu", s, (long long)st.reads);
        if (b == 1) {
          CHECK_MSG(syncs == 1, "cuda step %d: the host waited for the device %lld times", s, (long long)syncs);
          if (s == 1) reserved = st.mem_reserved;
          CHECK_MSG(s < 2 || st.mem_reserved == reserved, "cuda step %d: device memory grew from %lld to %lld bytes", s,
                    (long long)reserved, (long long)st.mem_reserved);
          CHECK(st.mem_reserved_peak >= st.mem_reserved && st.mem_in_use_peak > 0);
        }
        CHECK_OK(ampc_graph_read(r[b].g, ampc_model_loss(r[b].m), &loss[b][s], AMPC_DTYPE_F32));
        if (getenv("AMPC_TEST_VERBOSE")) printf("%s %s step %d: loss %.7g\n", cases[c].model, b ? "cuda" : "cpu", s, (double)loss[b][s]);
      }
      size_t n = ampc_graph_param_numel(r[b].g);
      vals[b] = malloc(n * sizeof(float));
      CHECK_OK(ampc_amp_param_values(r[b].amp, vals[b]));
    }
    if (ok) {
      for (int s = 0; s < cases[c].steps; s++)
        CHECK_MSG(fabs(loss[0][s] - loss[1][s]) <= cases[c].tol * fmax(1.0, fabs(loss[0][s])), "%s %s %s step %d: loss %.7g (cpu) vs %.7g (cuda)",
                  cases[c].model, ampc_opt_level_name(cases[c].lvl), ampc_dtype_name(cases[c].half), s, (double)loss[0][s], (double)loss[1][s]);
      size_t n = ampc_graph_param_numel(r[0].g);
      double e = 0.0, m = 0.0;
      for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)vals[0][i] - vals[1][i]));
        m = fmax(m, fabs((double)vals[0][i]));
      }
      CHECK_MSG(e <= cases[c].tol * m, "%s %s %s: parameters after %d steps differ by %.3g (largest %.3g)",
                cases[c].model, ampc_opt_level_name(cases[c].lvl), ampc_dtype_name(cases[c].half), cases[c].steps, e, m);
    }
    for (int b = 0; b < 2; b++) {
      free(vals[b]);
      rig_free(&r[b]);
    }
  }
}

/* The repeated forward and backward of a step run as a CUDA graph from the
 * third step on (captured, then replayed): the same bits as kernel by
 * kernel, and the same as before a change of batch or loss scale. */
TEST(cuda_graphs_give_the_same_bits) {
  NEED_DEVICE();
  enum { N = 6 };
  ampc_backend_opts bo[2];
  for (int k = 0; k < 2; k++) {
    ampc_backend_opts_default(&bo[k]);
    bo[k].no_cuda_graphs = k;
  }
  rig r[2];
  float loss[2][N];
  float *vals[2] = {NULL, NULL};
  int64_t launches = 0, captures = 0;
  int ok = rig_make_opts(&r[0], "cuda", &bo[0], "cnn", AMPC_OPT_O2, AMPC_DTYPE_F16) &&
           rig_make_opts(&r[1], "cuda", &bo[1], "cnn", AMPC_OPT_O2, AMPC_DTYPE_F16);
  for (int b = 0; ok && b < 2; b++) {
    int64_t l0 = ampc__cu_graph_launches, c0 = ampc__cu_graph_captures;
    for (int s = 0; s < N; s++) {
      write_batch(&r[b], 70 + (uint64_t)s);
      /* step 4 on a smaller batch: a sequence the graph does not hold */
      CHECK_OK(ampc_graph_set_batch(r[b].g, s == 4 ? BATCH - 2 : BATCH));
      CHECK_OK(ampc_amp_forward(r[b].amp, 1));
      CHECK_OK(ampc_amp_backward(r[b].amp, ampc_model_loss(r[b].m), 0, 0));
      CHECK_OK(ampc_graph_read(r[b].g, ampc_model_loss(r[b].m), &loss[b][s], AMPC_DTYPE_F32));
      CHECK_OK(ampc_amp_step(r[b].amp, 0.05f, NULL));
    }
    vals[b] = malloc(ampc_graph_param_numel(r[b].g) * sizeof(float));
    CHECK_OK(ampc_amp_param_values(r[b].amp, vals[b]));
    if (b == 0) {
      launches = ampc__cu_graph_launches - l0;
      captures = ampc__cu_graph_captures - c0;
    } else {
      CHECK_MSG(ampc__cu_graph_launches == l0, "graphs launched with no_cuda_graphs");
    }
  }
  if (ok) {
    /* steps 0 and 1 record; 2 captures and launches, 3 replays; 4 differs;
     * 5 is step 3's sequence again, seen once since: kernel by kernel */
    CHECK_MSG(captures == 1 && launches == 2, "%lld captures, %lld launches", (long long)captures, (long long)launches);
    CHECK_MSG(memcmp(loss[0], loss[1], sizeof loss[0]) == 0, "losses differ with and without graphs");
    CHECK_MSG(memcmp(vals[0], vals[1], ampc_graph_param_numel(r[0].g) * sizeof(float)) == 0,
              "parameters differ with and without graphs");
  }
  for (int b = 0; b < 2; b++) {
    free(vals[b]);
    rig_free(&r[b]);
  }
}

/* A checkpoint saved on the cuda device loads on the cpu (and back): the
 * same parameters, masters, optimizer state and scaler. */
TEST(checkpoints_move_between_devices) {
  NEED_DEVICE();
  rig a, b, c;
  char path[512];
  snprintf(path, sizeof path, "%s/cuda_ckpt.safetensors", AMPC_TEST_TMPDIR);
  int ok = rig_make(&a, "cuda", "cnn", AMPC_OPT_O2, AMPC_DTYPE_BF16) && rig_make(&b, "cpu", "cnn", AMPC_OPT_O2, AMPC_DTYPE_BF16) &&
           rig_make(&c, "cuda", "cnn", AMPC_OPT_O2, AMPC_DTYPE_BF16);
  if (ok) {
    for (int s = 0; s < 2; s++) {
      write_batch(&a, 90 + (uint64_t)s);
      CHECK_OK(ampc_amp_forward(a.amp, 1));
      CHECK_OK(ampc_amp_backward(a.amp, ampc_model_loss(a.m), 0, 0));
      CHECK_OK(ampc_amp_step(a.amp, 0.05f, NULL));
    }
    ampc_train_state ts = {.seed = 4, .step = 2};
    CHECK_OK(ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts));
    ampc_train_state back;
    CHECK_OK(ampc_checkpoint_load(path, b.m, b.amp, b.opt, &back));
    CHECK_OK(ampc_checkpoint_load(path, c.m, c.amp, c.opt, &back));
    size_t n = ampc_graph_param_numel(a.g);
    float *va = malloc(n * sizeof *va), *vb = malloc(n * sizeof *vb), *vc = malloc(n * sizeof *vc);
    CHECK_OK(ampc_amp_param_values(a.amp, va));
    CHECK_OK(ampc_amp_param_values(b.amp, vb));
    CHECK_OK(ampc_amp_param_values(c.amp, vc));
    CHECK_MSG(memcmp(va, vb, n * sizeof *va) == 0, "masters differ after loading on the cpu");
    CHECK_MSG(memcmp(va, vc, n * sizeof *va) == 0, "masters differ after loading on cuda again");
    for (size_t k = 0; k < ampc_optim_state_count(a.opt); k++) {
      CHECK_OK(ampc_optim_state_read(a.opt, k, 0, n, va));
      CHECK_OK(ampc_optim_state_read(b.opt, k, 0, n, vb));
      CHECK_MSG(memcmp(va, vb, n * sizeof *va) == 0, "optimizer state %zu differs", k);
    }
    free(va);
    free(vb);
    free(vc);
  }
  rig_free(&a);
  rig_free(&b);
  rig_free(&c);
}

/* SyncBatchNorm's sums do not leave the cuda device yet: asking for it
 * across ranks is an error, not per-rank statistics in silence (the cpu
 * takes it) */
TEST(sync_batchnorm_is_refused) {
  NEED_DEVICE();
  ampc_comm *ranks[2];
  CHECK_OK(ampc_comm_local_create(ranks, 2));
  rig r[2];
  const char *be[2] = {"cpu", "cuda"};
  for (int k = 0; k < 2; k++) {
    if (!rig_make(&r[k], be[k], "cnn", AMPC_OPT_O2, AMPC_DTYPE_F16)) return;
    ampc_amp_set_comm(r[k].amp, ranks[k]);
  }
  CHECK_OK(ampc_amp_set_sync_batchnorm(r[0].amp, 1));
  CHECK_MSG(ampc_amp_set_sync_batchnorm(r[1].amp, 1) == AMPC_EUNSUPPORTED, "cuda took SyncBatchNorm");
  CHECK_MSG(strstr(ampc_last_error(), "SyncBatchNorm") != NULL, "the error does not name SyncBatchNorm: %s", ampc_last_error());
  CHECK_OK(ampc_amp_set_sync_batchnorm(r[1].amp, 0));
  for (int k = 0; k < 2; k++) {
    rig_free(&r[k]);
    ampc_comm_free(ranks[k]);
  }
}

/* The notes name every convolution shape the graph compiled, with its three
 * algorithms, in whole lines that fit the buffer; the cpu has none. With
 * cudnn_any_algo the same shapes are chosen (by time alone) and a step runs. */
TEST(notes_name_each_convolution) {
  NEED_DEVICE();
  static char buf[1 << 14];
  rig c;
  if (!rig_make(&c, "cpu", "cnn", AMPC_OPT_O2, AMPC_DTYPE_F16)) return;
  CHECK(ampc_graph_backend_notes(c.g, buf, sizeof buf) == 0 && buf[0] == 0);
  rig_free(&c);
  for (int any = 0; any < 2; any++) {
    ampc_backend_opts bo;
    ampc_backend_opts_default(&bo);
    bo.cudnn_any_algo = any;
    rig r;
    if (!rig_make_opts(&r, "cuda", &bo, "cnn", AMPC_OPT_O2, AMPC_DTYPE_F16)) return;
    write_batch(&r, 90);
    CHECK_OK(ampc_amp_forward(r.amp, 1));
    CHECK_OK(ampc_amp_backward(r.amp, ampc_model_loss(r.m), 0, 0));
    CHECK_OK(ampc_amp_step(r.amp, 0.05f, NULL));
    size_t len = ampc_graph_backend_notes(r.g, buf, sizeof buf);
    CHECK_MSG(len == strlen(buf) && len > 0 && buf[len - 1] == '\n', "notes of %zu bytes: %s", len, buf);
    /* the cnn's two convolutions (the rig's 12x12 images): 1 -> 32 and 32 -> 64 channels */
    CHECK_MSG(strstr(buf, "x1x12x12 -> 32, 3x3 stride 1 pad 1, f16: forward ") != NULL, "%s", buf);
    CHECK_MSG(strstr(buf, "x32x6x6 -> 64, 3x3 stride 1 pad 1, f16: forward ") != NULL, "%s", buf);
    CHECK(strstr(buf, "; data ") != NULL && strstr(buf, "; filter ") != NULL);
    /* a buffer too small for the first line: nothing, never half a line */
    char small[16];
    CHECK(ampc_graph_backend_notes(r.g, small, sizeof small) == 0 && small[0] == 0);
    rig_free(&r);
  }
}

TEST_MAIN(TEST_ENTRY(no_device_error_is_one_line), TEST_ENTRY(conversions_give_the_cpu_bits), TEST_ENTRY(update_gives_the_cpu_bits),
          TEST_ENTRY(check_fold_nonfinite_agree_with_cpu), TEST_ENTRY(label_out_of_range_is_an_error),
          TEST_ENTRY(training_steps_follow_the_cpu), TEST_ENTRY(cuda_graphs_give_the_same_bits),
          TEST_ENTRY(checkpoints_move_between_devices), TEST_ENTRY(sync_batchnorm_is_refused),
          TEST_ENTRY(notes_name_each_convolution))
