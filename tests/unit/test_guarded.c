/* The whole training path on the guarded backend -- whose device memory is
 * inaccessible whenever control is outside a backend call -- gives the cpu
 * backend's results bit for bit: the cnn and ResNet-18 at O0-O3 in f16 and
 * bf16, with gradient accumulation, two losses, clipping, stochastic
 * rounding, skipped (overflowing) steps, checkpoint save and exact resume,
 * evaluation and the grad computation. A host access that bypasses the
 * interface faults (SIGSEGV), which a planted read checks. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ampc/ampc.h"
#include "core/graph_internal.h"
#include "data/data_internal.h"
#include "test.h"

enum { STEPS = 5, ACCUM = 2 };

typedef struct {
  ampc_model *m;
  ampc_graph *g;
  ampc_optim *opt;
  ampc_amp *amp;
  ampc_value loss2; /* a second loss (label smoothing 0.1), or NONE */
} rig;

typedef struct {
  const char *model;
  int c, hw, batch;
  ampc_opt_level lvl;
  ampc_dtype half;
  int two_losses, sr;
} scenario;

static int rig_make(rig *r, const char *backend, const scenario *sc) {
  memset(r, 0, sizeof *r);
  r->loss2 = AMPC_VALUE_NONE;
  ampc_model_opts mo = {.batch = sc->batch, .channels = sc->c, .height = sc->hw, .width = sc->hw, .classes = 10, .seed = 4};
  CHECK_OK(ampc_model_create(&r->m, sc->model, &mo));
  if (!r->m) return 0;
  r->g = ampc_model_graph(r->m);
  CHECK_OK(ampc_graph_set_backend(r->g, backend, NULL));
  if (sc->two_losses) r->loss2 = ampc_graph_cross_entropy(r->g, ampc_model_logits(r->m), ampc_model_labels(r->m), 0.1f);
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAMW);
  CHECK_OK(ampc_optim_create(&r->opt, &oc, ampc_graph_param_numel(r->g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, sc->lvl, sc->half));
  if (sc->two_losses) ac.num_losses = 2;
  /* a dynamic scale everywhere, so that the injected overflow is skipped
   * and backs the scale off */
  CHECK_OK(ampc_amp_config_set(&ac, "loss_scale", "dynamic"));
  CHECK_OK(ampc_amp_initialize(&r->amp, r->g, r->opt, &ac));
  if (!r->amp) return 0;
  ampc_amp_set_clip_grad_norm(r->amp, 0.5f);
  ampc_amp_set_loss_weight(r->amp, 1.0f / ACCUM);
  ampc_amp_set_stochastic_rounding(r->amp, sc->sr, 9);
  return 1;
}

static void rig_free(rig *r) {
  ampc_amp_free(r->amp);
  ampc_optim_free(r->opt);
  ampc_model_free(r->m);
}

static void write_batch(rig *r, uint64_t seed) {
  ampc_tensor x = ampc_graph_tensor(r->g, ampc_model_input(r->m));
  size_t n = (size_t)ampc_tensor_numel(&x), b = (size_t)ampc_graph_batch(r->g);
  float *v = malloc(n * sizeof *v);
  int32_t *y = malloc(b * sizeof *y);
  ampc_rng rng = ampc_rng_make(seed, AMPC_RNG_STREAM_USER);
  for (size_t i = 0; i < n; i++) v[i] = ampc_rng_normal(&rng);
  for (size_t i = 0; i < b; i++) y[i] = (int32_t)ampc_rng_below(&rng, 10);
  CHECK_OK(ampc_graph_write(r->g, ampc_model_input(r->m), v, AMPC_DTYPE_F32));
  CHECK_OK(ampc_graph_write(r->g, ampc_model_labels(r->m), y, AMPC_DTYPE_I32));
  free(v);
  free(y);
}

/* What a run leaves behind, to compare bit for bit. */
typedef struct {
  float *values;       /* every parameter as f32 (masters or model) */
  unsigned char *model; /* every parameter's model copy, as stored */
  size_t model_len;
  float *state[3];
  float losses[STEPS * ACCUM * 2];
  float norms[STEPS], scales[STEPS];
  int applied[STEPS];
  size_t numel, nstate;
} outcome;

static void outcome_free(outcome *o) {
  free(o->values);
  free(o->model);
  for (int i = 0; i < 3; i++) free(o->state[i]);
}

static void capture(rig *r, outcome *o) {
  o->numel = ampc_graph_param_numel(r->g);
  o->values = malloc(o->numel * sizeof(float));
  CHECK_OK(ampc_amp_param_values(r->amp, o->values));
  o->model_len = 0;
  for (size_t i = 0; i < ampc_graph_param_count(r->g); i++) {
    ampc_tensor t = ampc_graph_tensor(r->g, ampc_graph_param_at(r->g, i));
    o->model_len += ampc_tensor_nbytes(&t);
  }
  o->model = malloc(o->model_len);
  unsigned char *p = o->model;
  for (size_t i = 0; i < ampc_graph_param_count(r->g); i++) {
    ampc_value v = ampc_graph_param_at(r->g, i);
    ampc_tensor t = ampc_graph_tensor(r->g, v);
    CHECK_OK(ampc_graph_read(r->g, v, p, t.dtype));
    p += ampc_tensor_nbytes(&t);
  }
  o->nstate = ampc_optim_state_count(r->opt);
  for (size_t k = 0; k < o->nstate; k++) {
    o->state[k] = malloc(o->numel * sizeof(float));
    CHECK_OK(ampc_optim_state_read(r->opt, k, 0, o->numel, o->state[k]));
  }
}

/* Steps [from, to) of a run: ACCUM micro-batches each, the second loss
 * too where there is one; at step 2 the last micro-batch's backward is
 * seeded with an infinite loss weight, which makes the step overflow. */
static void run_steps(rig *r, int from, int to, outcome *o) {
  int nl = 0;
  for (int s = from; s < to; s++) {
    for (int mb = 0; mb < ACCUM; mb++) {
      write_batch(r, 100 + (uint64_t)(s * ACCUM + mb));
      CHECK_OK(ampc_amp_forward(r->amp, 1));
      int overflow = s == 2 && mb == ACCUM - 1;
      ampc_amp_set_loss_weight(r->amp, overflow ? INFINITY : 1.0f / ACCUM);
      CHECK_OK(ampc_amp_backward(r->amp, ampc_model_loss(r->m), 0, mb > 0));
      ampc_amp_set_loss_weight(r->amp, 1.0f / ACCUM);
      CHECK_OK(ampc_graph_read(r->g, ampc_model_loss(r->m), &o->losses[nl++], AMPC_DTYPE_F32));
      if (r->loss2 >= 0) {
        CHECK_OK(ampc_amp_backward(r->amp, r->loss2, 1, 1));
        CHECK_OK(ampc_graph_read(r->g, r->loss2, &o->losses[nl++], AMPC_DTYPE_F32));
      }
    }
    ampc_amp_step_info info;
    CHECK_OK(ampc_amp_step(r->amp, 1e-3f, &info));
    o->norms[s] = info.grad_norm;
    o->scales[s] = info.scale;
    o->applied[s] = info.applied;
  }
}

static void compare(const outcome *a, const outcome *b, const char *what) {
  CHECK_MSG(memcmp(a->values, b->values, a->numel * sizeof(float)) == 0, "%s: parameter values differ", what);
  CHECK_MSG(a->model_len == b->model_len && memcmp(a->model, b->model, a->model_len) == 0, "%s: model copies differ", what);
  for (size_t k = 0; k < a->nstate; k++)
    CHECK_MSG(memcmp(a->state[k], b->state[k], a->numel * sizeof(float)) == 0, "%s: optimizer state %zu differs", what, k);
  CHECK_MSG(memcmp(a->losses, b->losses, sizeof a->losses) == 0, "%s: losses differ", what);
  CHECK_MSG(memcmp(a->norms, b->norms, sizeof a->norms) == 0 && memcmp(a->scales, b->scales, sizeof a->scales) == 0 &&
                memcmp(a->applied, b->applied, sizeof a->applied) == 0,
            "%s: step results differ", what);
}

static const char *tmp(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", AMPC_TEST_TMPDIR, name);
  return buf;
}

/* A small in-memory dataset of the model's input shape. */
static ampc_dataset *dataset(const scenario *sc) {
  ampc_dataset *d = NULL;
  CHECK_OK(ampc__dataset_alloc(&d, sc->c == 3 ? AMPC_DATASET_CIFAR10 : AMPC_DATASET_FASHION_MNIST, 11, sc->c, sc->hw,
                               sc->hw, 10));
  if (!d) return NULL;
  size_t per = (size_t)sc->c * (size_t)sc->hw * (size_t)sc->hw;
  for (size_t i = 0; i < 11; i++) {
    d->labels[i] = (int32_t)(i % 10);
    for (size_t j = 0; j < per; j++) d->images[i * per + j] = (uint8_t)(i * 53 + j * 7);
  }
  return d;
}

/* One scenario on both backends: an unbroken run, a run resumed from a
 * checkpoint, evaluation and the unscaled gradients of one more batch. */
static void scenario_run(const scenario *sc) {
  const char *backends[2] = {"cpu", "cpu-guarded"};
  outcome full[2], resumed[2];
  memset(full, 0, sizeof full);
  memset(resumed, 0, sizeof resumed);
  ampc_eval_result ev[2];
  float *grads[2] = {NULL, NULL};
  char what[160];
  snprintf(what, sizeof what, "%s %s/%s%s%s", sc->model, ampc_opt_level_name(sc->lvl), ampc_dtype_name(sc->half),
           sc->two_losses ? " two losses" : "", sc->sr ? " stochastic rounding" : "");
  ampc_dataset *d = dataset(sc);
  for (int b = 0; b < 2; b++) {
    rig r;
    if (!rig_make(&r, backends[b], sc)) {
      rig_free(&r);
      continue;
    }
    run_steps(&r, 0, 3, &full[b]);
    ampc_train_state ts = {.seed = 4, .step = 3};
    CHECK_OK(ampc_checkpoint_save(tmp("guarded.safetensors"), r.m, r.amp, r.opt, &ts));
    run_steps(&r, 3, STEPS, &full[b]);
    capture(&r, &full[b]);
    if (d) CHECK_OK(ampc_model_evaluate(r.m, d, 1, &ev[b]));
    write_batch(&r, 7);
    CHECK_OK(ampc_amp_forward(r.amp, 1));
    CHECK_OK(ampc_amp_backward(r.amp, ampc_model_loss(r.m), 0, 0));
    grads[b] = malloc(ampc_graph_param_numel(r.g) * sizeof(float));
    CHECK_OK(ampc_amp_unscaled_grads(r.amp, grads[b], NULL));
    rig_free(&r);
    /* a new run from the checkpoint (saved on this backend) */
    rig q;
    if (rig_make(&q, backends[b], sc)) {
      ampc_train_state back;
      CHECK_OK(ampc_checkpoint_load(tmp("guarded.safetensors"), q.m, q.amp, q.opt, &back));
      CHECK(back.step == 3);
      memcpy(resumed[b].losses, full[b].losses, sizeof resumed[b].losses);
      memcpy(resumed[b].norms, full[b].norms, 3 * sizeof(float));
      memcpy(resumed[b].scales, full[b].scales, 3 * sizeof(float));
      memcpy(resumed[b].applied, full[b].applied, 3 * sizeof(int));
      run_steps(&q, 3, STEPS, &resumed[b]);
      capture(&q, &resumed[b]);
    }
    rig_free(&q);
  }
  char w2[200];
  snprintf(w2, sizeof w2, "%s: cpu vs cpu-guarded", what);
  if (full[0].values && full[1].values) compare(&full[0], &full[1], w2);
  snprintf(w2, sizeof w2, "%s: resumed vs unbroken (cpu-guarded)", what);
  if (full[1].values && resumed[1].values) compare(&full[1], &resumed[1], w2);
  CHECK_MSG(full[0].applied[2] == 0 && full[0].applied[3] + full[0].applied[4] >= 1,
            "%s: the planted overflow is skipped and later steps step (%d %d %d %d %d)", what, full[0].applied[0],
            full[0].applied[1], full[0].applied[2], full[0].applied[3], full[0].applied[4]);
  if (d)
    CHECK_MSG(memcmp(&ev[0], &ev[1], sizeof ev[0]) == 0, "%s: evaluation differs (%.9g %.9g vs %.9g %.9g)", what, ev[0].loss,
              ev[0].accuracy, ev[1].loss, ev[1].accuracy);
  if (grads[0] && grads[1])
    CHECK_MSG(memcmp(grads[0], grads[1], full[0].numel * sizeof(float)) == 0, "%s: unscaled gradients differ", what);
  for (int b = 0; b < 2; b++) {
    outcome_free(&full[b]);
    outcome_free(&resumed[b]);
    free(grads[b]);
  }
  ampc_dataset_free(d);
}

/* The quick pass (the sanitizer build) runs O2 and O3 in f16 only. */
static int quick(void) { return getenv("AMPC_TEST_QUICK") != NULL; }

TEST(cnn_every_level_on_both_backends) {
  static const ampc_dtype halves[] = {AMPC_DTYPE_F16, AMPC_DTYPE_BF16};
  for (int h = 0; h < (quick() ? 1 : 2); h++)
    for (int l = quick() ? AMPC_OPT_O2 : AMPC_OPT_O0; l <= AMPC_OPT_O3; l++) {
      scenario sc = {"cnn", 1, 12, 6, (ampc_opt_level)l, halves[h], 0, 0};
      scenario_run(&sc);
    }
}

TEST(two_losses_and_stochastic_rounding) {
  scenario a = {"cnn", 1, 12, 6, AMPC_OPT_O2, AMPC_DTYPE_F16, 1, 0};
  scenario_run(&a);
  scenario b = {"cnn", 1, 12, 6, AMPC_OPT_O3, AMPC_DTYPE_BF16, 0, 1};
  scenario_run(&b);
}

TEST(resnet18_on_both_backends) {
  scenario a = {"resnet18", 3, 8, 4, AMPC_OPT_O2, AMPC_DTYPE_F16, 0, 0};
  scenario_run(&a);
  if (quick()) return;
  scenario b = {"resnet18", 3, 8, 4, AMPC_OPT_O1, AMPC_DTYPE_BF16, 0, 0};
  scenario_run(&b);
}

/* The guard itself: through the interface the values are there; a read
 * through a device pointer from outside the backend kills the process with
 * SIGSEGV; the cpu backend's pointer is a plain host pointer. */
TEST(host_access_outside_the_backend_faults) {
  for (int guarded = 0; guarded < 2; guarded++) {
    scenario sc = {"mlp", 1, 4, 2, AMPC_OPT_O2, AMPC_DTYPE_F16, 0, 0};
    rig r;
    if (!rig_make(&r, guarded ? "cpu-guarded" : "cpu", &sc)) {
      rig_free(&r);
      continue;
    }
    ampc_value w = ampc_graph_param_at(r.g, 0);
    ampc_tensor wt = ampc_graph_tensor(r.g, w);
    uint16_t *vals = malloc((size_t)ampc_tensor_numel(&wt) * sizeof *vals);
    CHECK_OK(ampc_graph_read(r.g, w, vals, AMPC_DTYPE_F16));
    uint16_t first = vals[0];
    free(vals);
    CHECK_MSG((ampc_graph_tensor(r.g, w).data == NULL) == guarded, "guarded %d: tensor data pointer", guarded);
    const volatile uint16_t *raw = (const volatile uint16_t *)r.g->v[w].data; /* planted: bypasses the interface */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL); /* AddressSanitizer's handler would turn the fault into exit status 1 */
      uint16_t v = raw[0];
      _exit(v == first ? 0 : 3);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (guarded)
      CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "the planted read on cpu-guarded: status %#x", status);
    else
      CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the same read on cpu: status %#x", status);
    rig_free(&r);
  }
}

TEST_MAIN(TEST_ENTRY(cnn_every_level_on_both_backends), TEST_ENTRY(two_losses_and_stochastic_rounding),
          TEST_ENTRY(resnet18_on_both_backends), TEST_ENTRY(host_access_outside_the_backend_faults))
