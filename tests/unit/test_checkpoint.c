/* Checkpoints: save/load round trip of everything (on the cpu backend, on
 * the guarded one, and from one to the other), refusal of files from another
 * model, opt level or format version, and a failed write (as on a full disk)
 * that leaves the previous checkpoint loadable. */
#include "ampc/backend.h"
#include "ampc/checkpoint.h"
#include "ampc/rng.h"
#include "ampc/safetensors.h"
#include "io/fsutil_internal.h"
#include <sys/stat.h>

#include "test.h"

typedef struct {
  ampc_model *m;
  ampc_optim *opt;
  ampc_amp *amp;
} rig;

static void rig_make_half(rig *r, const char *model, ampc_opt_level lvl, const char *backend, ampc_dtype half) {
  ampc_model_opts o = {.batch = 8, .channels = 1, .height = 8, .width = 8, .classes = 4, .seed = 11};
  CHECK_OK(ampc_model_create(&r->m, model, &o));
  ampc_graph *g = ampc_model_graph(r->m);
  CHECK_OK(ampc_graph_set_backend(g, backend, NULL));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  CHECK_OK(ampc_optim_create(&r->opt, &oc, ampc_graph_param_numel(g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, lvl, half));
  CHECK_OK(ampc_amp_initialize(&r->amp, g, r->opt, &ac));
}

static void rig_make_on(rig *r, const char *model, ampc_opt_level lvl, const char *backend) {
  rig_make_half(r, model, lvl, backend, AMPC_DTYPE_F16);
}
static void rig_make(rig *r, const char *model, ampc_opt_level lvl) { rig_make_on(r, model, lvl, "cpu"); }

static void rig_free(rig *r) {
  ampc_amp_free(r->amp);
  ampc_optim_free(r->opt);
  ampc_model_free(r->m);
}

static void train_steps(rig *r, int n, uint64_t seed) {
  ampc_graph *g = ampc_model_graph(r->m);
  ampc_rng rng = ampc_rng_make(seed, AMPC_RNG_STREAM_USER);
  for (int s = 0; s < n; s++) {
    float buf[8 * 64];
    int32_t lab[8];
    for (int i = 0; i < 8 * 64; i++) buf[i] = ampc_rng_normal(&rng);
    for (int i = 0; i < 8; i++) lab[i] = (int32_t)ampc_rng_below(&rng, 4);
    CHECK_OK(ampc_graph_write(g, ampc_model_input(r->m), buf, AMPC_DTYPE_F32));
    CHECK_OK(ampc_graph_write(g, ampc_model_labels(r->m), lab, AMPC_DTYPE_I32));
    CHECK_OK(ampc_amp_forward(r->amp, 1));
    CHECK_OK(ampc_amp_backward(r->amp, ampc_model_loss(r->m), 0, 0));
    CHECK_OK(ampc_amp_step(r->amp, 1e-2f, NULL));
  }
}

static float *params_of(rig *r) {
  size_t n = ampc_graph_param_numel(ampc_model_graph(r->m));
  float *v = malloc(n * sizeof *v);
  CHECK_OK(ampc_amp_param_values(r->amp, v));
  return v;
}

static const char *tmp(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", AMPC_TEST_TMPDIR, name);
  return buf[k];
}

/* Saved on backend `from` and loaded on `to`, a run continues exactly as
 * the unbroken one. */
static void roundtrip(const char *from, const char *to) {
  for (int lvl = AMPC_OPT_O0; lvl <= AMPC_OPT_O3; lvl++) {
    rig a, b;
    rig_make_on(&a, "cnn", (ampc_opt_level)lvl, from);
    train_steps(&a, 3, 1);
    ampc_train_state ts = {.seed = 5, .epoch = 2, .batch = 7, .step = 3, .loss_sum = 1.25, .seen = 24};
    CHECK_OK(ampc_checkpoint_save(tmp("rt.safetensors"), a.m, a.amp, a.opt, &ts));
    rig_make_on(&b, "cnn", (ampc_opt_level)lvl, to);
    ampc_train_state back;
    CHECK_OK(ampc_checkpoint_load(tmp("rt.safetensors"), b.m, b.amp, b.opt, &back));
    CHECK(back.epoch == 2 && back.batch == 7 && back.step == 3 && back.loss_sum == 1.25 && back.seen == 24 && back.seed == 5);
    CHECK(ampc_optim_step_count(b.opt) == ampc_optim_step_count(a.opt));
    CHECK(ampc_scaler_scale(ampc_amp_scaler(b.amp, 0)) == ampc_scaler_scale(ampc_amp_scaler(a.amp, 0)));
    train_steps(&a, 2, 9);
    train_steps(&b, 2, 9);
    float *pa = params_of(&a), *pb = params_of(&b);
    size_t n = ampc_graph_param_numel(ampc_model_graph(a.m));
    CHECK_MSG(memcmp(pa, pb, n * sizeof(float)) == 0, "%s -> %s, opt level %d: weights differ after resuming", from, to, lvl);
    free(pa);
    free(pb);
    rig_free(&a);
    rig_free(&b);
  }
}

TEST(roundtrip_continues_exactly) { roundtrip("cpu", "cpu"); }

/* A NULL run state saves the optimizer's step count as the step: the file
 * loads back (a step of 0 below the optimizer's count would not) */
TEST(null_run_state_loads_back) {
  rig a, b;
  rig_make(&a, "mlp", AMPC_OPT_O0);
  train_steps(&a, 2, 3);
  CHECK_OK(ampc_checkpoint_save(tmp("nots.safetensors"), a.m, a.amp, a.opt, NULL));
  rig_make(&b, "mlp", AMPC_OPT_O0);
  ampc_train_state back;
  CHECK_OK(ampc_checkpoint_load(tmp("nots.safetensors"), b.m, b.amp, b.opt, &back));
  CHECK(back.step == 2 && back.epoch == 0 && back.seen == 0);
  CHECK_OK(ampc_checkpoint_load(tmp("nots.safetensors"), b.m, b.amp, NULL, NULL));
  rig_free(&a);
  rig_free(&b);
}
TEST(roundtrip_on_the_guarded_backend) {
  roundtrip("cpu-guarded", "cpu-guarded");
  roundtrip("cpu", "cpu-guarded");
  roundtrip("cpu-guarded", "cpu");
}

TEST(refuses_other_model_level_version) {
  rig a, b, c;
  rig_make(&a, "cnn", AMPC_OPT_O2);
  ampc_train_state ts = {0};
  CHECK_OK(ampc_checkpoint_save(tmp("cnn.safetensors"), a.m, a.amp, a.opt, &ts));
  rig_make(&b, "mlp", AMPC_OPT_O2);
  CHECK_ERR(ampc_checkpoint_load(tmp("cnn.safetensors"), b.m, b.amp, b.opt, &ts), AMPC_EINVAL, "saved from model cnn, not mlp");
  rig_make(&c, "cnn", AMPC_OPT_O0);
  CHECK_ERR(ampc_checkpoint_load(tmp("cnn.safetensors"), c.m, c.amp, c.opt, &ts), AMPC_EINVAL, "saved at opt level O2");
  /* a plain weights file, and a future format version */
  float one = 1.0f;
  ampc_st_tensor t = {.name = "x", .dtype = AMPC_DTYPE_F32, .ndim = 1, .shape = {1}, .values = &one, .nbytes = 4};
  CHECK_OK(ampc_st_write(tmp("plain.safetensors"), &t, 1, NULL));
  CHECK_ERR(ampc_checkpoint_load(tmp("plain.safetensors"), a.m, a.amp, a.opt, &ts), AMPC_EFORMAT, "not an ampc checkpoint");
  const char *meta[] = {"format", AMPC_CHECKPOINT_FORMAT, "format_version", "99", "ampc", "{}", NULL};
  CHECK_OK(ampc_st_write(tmp("v99.safetensors"), &t, 1, meta));
  CHECK_ERR(ampc_checkpoint_load(tmp("v99.safetensors"), a.m, a.amp, a.opt, &ts), AMPC_EUNSUPPORTED, "format version 99");
  /* the version as ampc writes it: "01" is not version 1 */
  meta[3] = "01";
  CHECK_OK(ampc_st_write(tmp("v01.safetensors"), &t, 1, meta));
  CHECK_ERR(ampc_checkpoint_load(tmp("v01.safetensors"), a.m, a.amp, a.opt, &ts), AMPC_EUNSUPPORTED, "format version 01");
  /* the half type matters where something is half: an O2 f16 checkpoint is
   * refused at O2 bf16; at O0 (all f32) the half type recorded is no one's */
  rig d, e;
  rig_make_half(&d, "cnn", AMPC_OPT_O2, "cpu", AMPC_DTYPE_BF16);
  CHECK_ERR(ampc_checkpoint_load(tmp("cnn.safetensors"), d.m, d.amp, d.opt, &ts), AMPC_EINVAL, "saved at opt level O2 with half f16, the run uses O2 with bf16");
  rig_free(&d);
  rig_make_half(&e, "cnn", AMPC_OPT_O0, "cpu", AMPC_DTYPE_BF16);
  CHECK_OK(ampc_checkpoint_save(tmp("o0_bf16.safetensors"), e.m, e.amp, e.opt, &ts));
  CHECK_OK(ampc_checkpoint_load(tmp("o0_bf16.safetensors"), c.m, c.amp, c.opt, &ts));
  rig_free(&e);
  rig_free(&a);
  rig_free(&b);
  rig_free(&c);
}

TEST(failed_write_keeps_previous_checkpoint) {
  rig a, b;
  rig_make(&a, "cnn", AMPC_OPT_O2);
  train_steps(&a, 2, 3);
  ampc_train_state ts = {.step = 2};
  const char *path = tmp("full_disk.safetensors");
  CHECK_OK(ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts));
  float *saved = params_of(&a);
  train_steps(&a, 2, 4);
  ts.step = 4;
  for (long long cut = 0; cut < 300000; cut = cut * 4 + 1000) {
    ampc__fsutil_fail_after(cut); /* the cut-th byte written fails, as on a full disk */
    ampc_status s = ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts);
    CHECK_MSG(s < 0 && strstr(ampc_last_error(), "was not changed"), "cut at %lld: status %d, '%s'", cut, s, ampc_last_error());
  }
  ampc__fsutil_fail_after(-1);
  rig_make(&b, "cnn", AMPC_OPT_O2);
  ampc_train_state back;
  CHECK_OK(ampc_checkpoint_load(path, b.m, b.amp, b.opt, &back));
  CHECK(back.step == 2);
  float *loaded = params_of(&b);
  CHECK(memcmp(saved, loaded, ampc_graph_param_numel(ampc_model_graph(b.m)) * sizeof(float)) == 0);
  free(saved);
  free(loaded);
  rig_free(&a);
  rig_free(&b);
}

/* Rewrites the "ampc" metadata of a checkpoint: the first `from` replaced by `to`. */
static void edit_state(const char *in, const char *out, const char *from, const char *to) {
  ampc_st_file *f;
  CHECK_OK(ampc_st_open(&f, in));
  size_t n = ampc_st_count(f), nm = ampc_st_metadata_count(f);
  ampc_st_tensor *ts = calloc(n, sizeof *ts);
  for (size_t i = 0; i < n; i++) ts[i] = *ampc_st_get(f, i);
  const char **meta = calloc(2 * nm + 1, sizeof *meta);
  char *js = NULL;
  for (size_t i = 0; i < nm; i++) {
    const char *k = ampc_st_metadata_key(f, i), *v = ampc_st_metadata(f, k);
    const char *at = strstr(v, from);
    if (at) {
      js = malloc(strlen(v) + strlen(to) + 1);
      snprintf(js, strlen(v) + strlen(to) + 1, "%.*s%s%s", (int)(at - v), v, to, at + strlen(from));
      v = js;
    }
    meta[2 * i] = k;
    meta[2 * i + 1] = v;
  }
  CHECK_OK(ampc_st_write(out, ts, n, meta));
  free(js);
  free(meta);
  free(ts);
  ampc_st_close(f);
}

/* Issue 11: the recorded input shape and classes, every number of the run
 * state in its full width, and nothing restored when a check fails. */
TEST(checks_shapes_and_ranges) {
  rig a, b, c;
  rig_make(&a, "mlp", AMPC_OPT_O0);
  train_steps(&a, 1, 5);
  ampc_train_state ts = {.seed = 3, .epoch = 1, .batch = 2, .step = 5, .seen = 16, .skipped = 1, .skipped_total = 2, .loss_sum = 3.5,
                         .world_size = 1, .global_batch = 8,
                         .preprocessing = {"fashion-mnist", 1, 1, 8, 8, {0.25f, 0, 0}, {0.5f, 1, 1}},
                         .has_grad_stats = 1, .grad_values = 1000, .grad_underflow = 7, .grad_max_abs = 0.375,
                         .log_loss_sum = 2.5, .log_steps = 2};
  char path[512]; /* tmp()'s buffers are reused */
  snprintf(path, sizeof path, "%s", tmp("mlp_ranges.safetensors"));
  CHECK_OK(ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts));
  ampc_st_file *hf;
  CHECK_OK(ampc_st_open_header(&hf, path));
  int ch = 0, h = 0, w = 0, k = 0;
  CHECK(ampc_checkpoint_input(hf, &ch, &h, &w, &k) == 1);
  CHECK(ch == 1 && h == 8 && w == 8 && k == 4);
  CHECK(ampc_st_get(hf, 0)->values == NULL);
  ampc_st_close(hf);
  /* another input shape with the same tensors (the mlp's first layer sees H * W = 64) */
  ampc_model_opts o = {.batch = 8, .channels = 1, .height = 16, .width = 4, .classes = 4, .seed = 11};
  CHECK_OK(ampc_model_create(&b.m, "mlp", &o));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  CHECK_OK(ampc_optim_create(&b.opt, &oc, ampc_graph_param_numel(ampc_model_graph(b.m))));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, AMPC_OPT_O0, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_initialize(&b.amp, ampc_model_graph(b.m), b.opt, &ac));
  CHECK_ERR(ampc_checkpoint_load(path, b.m, b.amp, b.opt, &ts), AMPC_EINVAL, "made for 1x8x8 inputs and 4 classes, but the model here takes 1x16x4 inputs and 4 classes");
  rig_make(&c, "mlp", AMPC_OPT_O0);
  float *fresh = params_of(&c);
  size_t np = ampc_graph_param_numel(ampc_model_graph(c.m));
  const struct {
    const char *from, *to, *msg;
  } bad[] = {
      {"\"epoch\":1,", "\"epoch\":-1,", "'epoch' = -1 is outside"},
      {"\"seen\":16,", "\"seen\":\"16\",", "'seen' is of another type, not an integer"},
      {"\"skipped\":1,", "\"skipped\":3,", "'skipped' = 3 is outside [0, 2]"},
      {"\"hysteresis_left\":1,", "\"hysteresis_left\":4294967297,", "'hysteresis_left' = 4294967297 is outside [1, 2147483647]"},
      {"\"loss_sum\":3.5", "\"loss_sum\":-3.5", "'loss_sum' is negative or not finite"},
      {"\"scale\":1.0", "\"scale\":1e39", "is not a positive finite f32"},
      {"\"optimizer_step\":", "\"optimizer_stepx\":", "'optimizer_step' is missing"},
      /* counters past any run: the step count would overflow, the sums and
       * the first image of a batch would be nonsense or overflow */
      {"\"step\":5,", "\"step\":9223372036854775807,", "'step' = 9223372036854775807 is outside [0, 1099511627776]"},
      {"\"seen\":16,", "\"seen\":4611686018427387904,", "'seen' = 4611686018427387904 is outside [0, 9007199254740992]"},
      {"\"loss_sum\":3.5", "\"loss_sum\":1e300", "'loss_sum' = 1e+300 is more than 1e+30 per image of 'seen' = 16"},
      {"\"seen\":16,", "\"seen\":0,", "'loss_sum' = 3.5 is more than 1e+30 per image of 'seen' = 0"},
      {"\"global_batch\":8", "\"global_batch\":4611686018427387904", "'global_batch' = 4611686018427387904 is outside [1, 2147483648]"},
      {"\"batch\":2,", "\"batch\":1099511627777,", "'batch' = 1099511627777 is outside [0, 1099511627776]"},
      /* Adam's bias correction from more steps than the run took; an optimizer ampc does not have */
      {"\"optimizer_step\":1", "\"optimizer_step\":6", "'optimizer_step' = 6 is more than 'step' = 5"},
      {"\"optimizer\":\"adam\"", "\"optimizer\":\"lamb\"", "'optimizer' is 'lamb', not one of sgd, adam or adamw"},
      {"\"optimizer\":\"adam\"", "\"optimizer\":7", "'optimizer' is not a string"},
      /* the epoch (a resume prints epoch + 1) and the scaler's counters (each step adds to them) bounded */
      {"\"epoch\":1,", "\"epoch\":9223372036854775807,", "'epoch' = 9223372036854775807 is outside [0, 1099511627776]"},
      {"\"steps\":", "\"steps\":9223372036854775807,\"stepsx\":", "'steps' = 9223372036854775807 is outside [0, 9007199254740992]"},
      {"\"growth_tracker\":", "\"growth_tracker\":9007199254740993,\"gt\":", "'growth_tracker' = 9007199254740993 is outside"},
      {"\"overflows\":", "\"overflows\":9007199254740993,\"ov\":", "'overflows' = 9007199254740993 is outside"},
      /* the scaler's counters, each in range, but more of a part than of its whole */
      {"\"skipped_steps\":", "\"skipped_steps\":7,\"sk\":", "scaler 0: 'skipped_steps' = 7 is more than 'steps' = "},
      {"\"min_scale_hits\":", "\"min_scale_hits\":3,\"msh\":", "scaler 0: 'min_scale_hits' = 3 is more than 'overflows' = "},
      /* a duplicate key (the outer header refuses them too) */
      {"\"epoch\":1,", "\"epoch\":1,\"epoch\":2,", "malformed metadata: duplicate object key"},
      /* the preprocessing record, which a resumed run copies into its checkpoints and exports */
      {"\"shape\":[1,8,8]", "\"shape\":[1099511627776,8,8]", "preprocessing: 'shape' has channels that is not an integer in 1..3"},
      {"\"shape\":[1,8,8]", "\"shape\":[1,-5,8]", "preprocessing: 'shape' has height that is not an integer in 1..2147483647"},
      {"\"mean\":[", "\"mean\":[1e300,", "'mean' and 'std' must each be an array of one number per channel (1)"},
      {"\"mean\":[", "\"mean\":[1e300],\"meanx\":[", "preprocessing: 'mean'[0] is not a number in -1e6..1e6"},
      {"\"std\":[", "\"std\":[0],\"stdx\":[", "preprocessing: 'std'[0] is not a number in 1e-6..1e6"},
      {"\"std\":[", "\"std\":[null],\"stdx\":[", "preprocessing: 'std'[0] is not a number"},
      {"\"normalize\":true", "\"normalize\":1", "preprocessing: 'normalize' is missing or not true/false"},
      {"\"dataset\":\"fashion-mnist\"", "\"dataset\":\"\"", "preprocessing: 'dataset' is missing or not a name"},
      {"\"preprocessing\":{", "\"preprocessing\":[],\"pp\":{", "preprocessing: not a JSON object"},
      /* --amp-report's statistics of the epoch so far */
      {"\"underflow\":7", "\"underflow\":1001", "grad_stats 'underflow' = 1001 is outside [0, 1000]"},
      {"\"values\":1000", "\"values\":-1000", "grad_stats 'values' = -1000 is outside [0, 4611686018427387904]"},
      {"\"max_abs\":0.375", "\"max_abs\":-0.375", "grad_stats 'max_abs' is negative or past the largest f32"},
      {"\"grad_stats\":{", "\"grad_stats\":7,\"gs\":{", "'grad_stats' is not an object"},
      /* the steps since the last step record */
      {"\"log_steps\":2", "\"log_steps\":6", "'log_steps' = 6 is outside [1, 5]"},
      {"\"log_loss_sum\":2.5", "\"log_loss_sum\":-2.5", "'log_loss_sum' is negative or not finite"},
      {"\"log_loss_sum\":2.5", "\"log_loss_sum\":1e300", "'log_loss_sum' = 1e+300 is more than 1e+30 per step of 'log_steps' = 2"},
  };
  const size_t nbad = sizeof bad / sizeof bad[0];
  for (size_t i = 0; i <= nbad; i++) {
    char p2[512];
    snprintf(p2, sizeof p2, "%s", tmp("mlp_bad.safetensors"));
    const char *msg = i < nbad ? bad[i].msg : "'batch' = 1099511627776 of 'global_batch' = 2147483648 images is more than 9007199254740992";
    if (i < nbad) {
      edit_state(path, p2, bad[i].from, bad[i].to);
    } else {
      /* last: batch and global_batch each in range, but not the first image
       * of the batch, batch x global_batch, that a resume with another
       * global batch starts at */
      char p3[512];
      snprintf(p3, sizeof p3, "%s", tmp("mlp_bad2.safetensors"));
      edit_state(path, p3, "\"batch\":2,", "\"batch\":1099511627776,");
      edit_state(p3, p2, "\"global_batch\":8", "\"global_batch\":2147483648");
    }
    ampc_train_state back = {0};
    ampc_status s = ampc_checkpoint_load(p2, c.m, c.amp, c.opt, &back);
    CHECK_MSG(s < 0 && strstr(ampc_last_error(), msg), "case %zu: status %d, '%s'", i, s, ampc_last_error());
    float *now = params_of(&c);
    CHECK_MSG(memcmp(fresh, now, np * sizeof *now) == 0, "case %zu: a failed load changed the parameters", i);
    CHECK(back.step == 0);
    free(now);
  }
  CHECK_OK(ampc_checkpoint_load(path, c.m, c.amp, c.opt, &ts));
  CHECK(ts.epoch == 1 && ts.batch == 2 && ts.step == 5 && ts.seen == 16 && ts.skipped == 1 && ts.skipped_total == 2);
  CHECK(ts.global_batch == 8 && ts.world_size == 1 && ampc_optim_step_count(c.opt) == 1);
  CHECK(ts.has_grad_stats == 1 && ts.grad_values == 1000 && ts.grad_underflow == 7 && ts.grad_max_abs == 0.375);
  CHECK(ts.log_steps == 2 && ts.log_loss_sum == 2.5);
  /* a non-finite loss since the last record travels as null, back as NaN */
  {
    char p4[512];
    snprintf(p4, sizeof p4, "%s", tmp("mlp_lognan.safetensors"));
    edit_state(path, p4, "\"log_loss_sum\":2.5", "\"log_loss_sum\":null");
    ampc_train_state back = {0};
    CHECK_OK(ampc_checkpoint_load(p4, c.m, c.amp, c.opt, &back));
    CHECK(back.log_steps == 2 && isnan(back.log_loss_sum));
  }
  /* an epoch that had a step whose loss was not finite (an overflow) saves
   * (its loss_sum as null) and loads back as not finite: a stop or a
   * --save-every checkpoint in such an epoch failed, and the run with it */
  {
    const char *p5 = tmp("mlp_nan_sum.safetensors");
    ampc_train_state b = ts;
    b.loss_sum = INFINITY;
    CHECK_OK(ampc_checkpoint_save(p5, a.m, a.amp, a.opt, &b));
    ampc_train_state back = {0};
    CHECK_OK(ampc_checkpoint_load(p5, c.m, c.amp, c.opt, &back));
    CHECK(!isfinite(back.loss_sum) && back.seen == b.seen);
  }
  /* what loading would refuse is not saved: nothing written, the file
   * there before kept; the message is loading's, naming the entry */
  {
    const char *bad = tmp("mlp_badsave.safetensors");
    CHECK_OK(ampc_checkpoint_save(bad, a.m, a.amp, a.opt, &ts));
    struct stat before;
    CHECK(stat(bad, &before) == 0);
    static const struct {
      const char *field, *msg;
      ampc_status code;
    } cases[] = {
        {"grad_underflow", "grad_stats 'underflow' = 1001 is outside [0, 1000]", AMPC_EINVAL},
        {"grad_max_abs", "the run state's 'grad_max_abs' is not finite", AMPC_EINVAL},
        {"log_steps", "'log_steps' = 6 is outside [1, 5]", AMPC_EINVAL},
        {"seen", "'seen' = -1 is outside", AMPC_EINVAL},
        {"skipped", "'skipped' = 3 is outside [0, 2]", AMPC_EINVAL},
        {"step", "'optimizer_step' = 1 is more than 'step' = 0", AMPC_EINVAL},
        {"loss_sum_huge", "'loss_sum' = 1e+300 is more than 1e+30 per image", AMPC_EINVAL},
        {"train_seconds", "'train_seconds' is negative or not finite", AMPC_EINVAL},
        {"global_batch", "'global_batch' = -8 is outside [1, 2147483648]", AMPC_EINVAL},
        {"preprocessing", "'std'[0] is not a number in 1e-6..1e6", AMPC_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      ampc_train_state b = ts;
      const char *f = cases[i].field;
      if (!strcmp(f, "grad_underflow")) b.grad_underflow = b.grad_values + 1;
      if (!strcmp(f, "grad_max_abs")) b.grad_max_abs = INFINITY;
      if (!strcmp(f, "log_steps")) b.log_steps = b.step + 1;
      if (!strcmp(f, "seen")) b.seen = -1;
      if (!strcmp(f, "skipped")) b.skipped = b.skipped_total + 1;
      if (!strcmp(f, "step")) b.step = b.skipped_total = b.skipped = b.log_steps = 0;
      if (!strcmp(f, "loss_sum_huge")) b.loss_sum = 1e300;
      if (!strcmp(f, "train_seconds")) b.train_seconds = -1.0;
      if (!strcmp(f, "global_batch")) b.global_batch = -8;
      if (!strcmp(f, "preprocessing")) b.preprocessing.std[0] = 0.0f;
      ampc_status s = ampc_checkpoint_save(bad, a.m, a.amp, a.opt, &b);
      CHECK_MSG(s == cases[i].code && strstr(ampc_last_error(), cases[i].msg), "case %s: status %d, '%s'", f, s, ampc_last_error());
      struct stat after;
      CHECK_MSG(stat(bad, &after) == 0 && after.st_ino == before.st_ino && after.st_size == before.st_size,
                "case %s: the file there before was replaced", f);
    }
  }
  CHECK(strcmp(ts.preprocessing.dataset, "fashion-mnist") == 0 && ts.preprocessing.normalize == 1 && ts.preprocessing.channels == 1);
  CHECK(ts.preprocessing.height == 8 && ts.preprocessing.mean[0] == 0.25f && ts.preprocessing.std[0] == 0.5f);
  /* the record's parser, as the library's API has it */
  ampc_preprocessing pp;
  char *pj = ampc_preprocessing_json(&ts.preprocessing);
  CHECK(pj != NULL);
  CHECK_OK(ampc_preprocessing_parse(pj, &pp));
  CHECK(memcmp(&pp, &ts.preprocessing, sizeof pp) == 0);
  free(pj);
  CHECK_ERR(ampc_preprocessing_parse("{", &pp), AMPC_EFORMAT, "preprocessing: not JSON");
  CHECK_ERR(ampc_preprocessing_parse(NULL, &pp), AMPC_EINVAL, "NULL");
  free(fresh);
  rig_free(&a);
  rig_free(&b);
  rig_free(&c);
}

/* in without its tensor `name`, as out */
static void drop_tensor(const char *in, const char *out, const char *name) {
  ampc_st_file *f;
  CHECK_OK(ampc_st_open(&f, in));
  size_t n = ampc_st_count(f), nm = ampc_st_metadata_count(f), k = 0;
  ampc_st_tensor *ts = calloc(n, sizeof *ts);
  for (size_t i = 0; i < n; i++)
    if (strcmp(ampc_st_get(f, i)->name, name) != 0) ts[k++] = *ampc_st_get(f, i);
  CHECK(k + 1 == n);
  const char **meta = calloc(2 * nm + 1, sizeof *meta);
  for (size_t i = 0; i < nm; i++) {
    meta[2 * i] = ampc_st_metadata_key(f, i);
    meta[2 * i + 1] = ampc_st_metadata(f, meta[2 * i]);
  }
  CHECK_OK(ampc_st_write(out, ts, k, meta));
  free(meta);
  free(ts);
  ampc_st_close(f);
}

/* A checkpoint saved with master weights that lacks one: the model's own
 * (f16) copy of that parameter is not its value, so the load is refused,
 * naming the master, and changes nothing; as weights alone (no masters
 * needed) the file still loads. */
TEST(refuses_a_missing_master) {
  rig a, b;
  rig_make(&a, "mlp", AMPC_OPT_O2);
  train_steps(&a, 2, 3);
  ampc_train_state ts = {.seed = 1, .step = 2};
  char path[512], cut[512];
  snprintf(path, sizeof path, "%s", tmp("o2.safetensors"));
  snprintf(cut, sizeof cut, "%s", tmp("o2_cut.safetensors"));
  CHECK_OK(ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts));
  const char *p0 = ampc_graph_name(ampc_model_graph(a.m), ampc_graph_param_at(ampc_model_graph(a.m), 0));
  char mname[256], msg[512];
  snprintf(mname, sizeof mname, "master.%s", p0);
  drop_tensor(path, cut, mname);
  rig_make(&b, "mlp", AMPC_OPT_O2);
  float *fresh = params_of(&b);
  size_t np = ampc_graph_param_numel(ampc_model_graph(b.m));
  ampc_train_state back = {0};
  snprintf(msg, sizeof msg, "missing tensor '%s' (the f32 master copy of '%s'; the checkpoint was saved with master weights)", mname, p0);
  CHECK_ERR(ampc_checkpoint_load(cut, b.m, b.amp, b.opt, &back), AMPC_EFORMAT, msg);
  float *now = params_of(&b);
  CHECK_MSG(memcmp(fresh, now, np * sizeof *now) == 0, "a refused load changed the parameters");
  CHECK(back.step == 0 && ampc_optim_step_count(b.opt) == 0);
  CHECK_OK(ampc_checkpoint_load_weights(cut, b.m, b.amp));
  CHECK_OK(ampc_checkpoint_load(path, b.m, b.amp, b.opt, &back));
  CHECK(back.step == 2);
  free(fresh);
  free(now);
  rig_free(&a);
  rig_free(&b);
}

/* A dynamic scale without a ceiling (max_loss_scale none: infinite, which
 * JSON cannot hold) saves and loads back (it failed as "out of memory"). */
TEST(saves_a_scale_without_ceiling) {
  rig a;
  ampc_model_opts o = {.batch = 8, .channels = 1, .height = 8, .width = 8, .classes = 4, .seed = 11};
  CHECK_OK(ampc_model_create(&a.m, "mlp", &o));
  ampc_graph *g = ampc_model_graph(a.m);
  CHECK_OK(ampc_graph_set_backend(g, "cpu", NULL));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  CHECK_OK(ampc_optim_create(&a.opt, &oc, ampc_graph_param_numel(g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, AMPC_OPT_O2, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_config_set(&ac, "max_loss_scale", "none"));
  CHECK_OK(ampc_amp_initialize(&a.amp, g, a.opt, &ac));
  train_steps(&a, 2, 4);
  char path[512];
  snprintf(path, sizeof path, "%s", tmp("noceiling.safetensors"));
  ampc_train_state ts = {.seed = 1, .step = 2};
  CHECK_OK(ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts));
  ampc_st_file *f;
  CHECK_OK(ampc_st_open_header(&f, path));
  CHECK(strstr(ampc_st_metadata(f, "ampc"), "\"max_loss_scale\":null") != NULL);
  ampc_st_close(f);
  ampc_train_state back = {0};
  CHECK_OK(ampc_checkpoint_load(path, a.m, a.amp, a.opt, &back));
  CHECK(back.step == 2);
  rig_free(&a);
}

/* The mlp with optimizer kind, at O0. */
static void rig_make_optim(rig *r, ampc_optim_kind kind) {
  ampc_model_opts o = {.batch = 8, .channels = 1, .height = 8, .width = 8, .classes = 4, .seed = 11};
  CHECK_OK(ampc_model_create(&r->m, "mlp", &o));
  ampc_graph *g = ampc_model_graph(r->m);
  CHECK_OK(ampc_graph_set_backend(g, "cpu", NULL));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, kind);
  if (kind == AMPC_OPTIM_SGD) oc.momentum = 0.9f; /* with state of its own (momentum_buffer) */
  CHECK_OK(ampc_optim_create(&r->opt, &oc, ampc_graph_param_numel(g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, AMPC_OPT_O0, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_initialize(&r->amp, g, r->opt, &ac));
}

/* The optimizer state is another optimizer's: refused by name before any
 * tensor is read, either way round, and nothing is changed. */
TEST(refuses_another_optimizer) {
  rig adam, sgd, into;
  rig_make_optim(&adam, AMPC_OPTIM_ADAM);
  rig_make_optim(&sgd, AMPC_OPTIM_SGD);
  train_steps(&adam, 2, 1);
  train_steps(&sgd, 2, 1);
  ampc_train_state ts = {.seed = 1, .step = 2};
  char pa[512], ps[512];
  snprintf(pa, sizeof pa, "%s", tmp("adam.safetensors"));
  snprintf(ps, sizeof ps, "%s", tmp("sgd.safetensors"));
  CHECK_OK(ampc_checkpoint_save(pa, adam.m, adam.amp, adam.opt, &ts));
  CHECK_OK(ampc_checkpoint_save(ps, sgd.m, sgd.amp, sgd.opt, &ts));
  rig_make_optim(&into, AMPC_OPTIM_SGD);
  float *fresh = params_of(&into);
  size_t np = ampc_graph_param_numel(ampc_model_graph(into.m));
  ampc_train_state back = {0};
  CHECK_ERR(ampc_checkpoint_load(pa, into.m, into.amp, into.opt, &back), AMPC_EINVAL, "saved with optimizer adam, the run uses sgd");
  float *now = params_of(&into);
  CHECK_MSG(memcmp(fresh, now, np * sizeof *now) == 0, "a refused load changed the parameters");
  CHECK(back.step == 0 && ampc_optim_step_count(into.opt) == 0);
  CHECK_ERR(ampc_checkpoint_load(ps, adam.m, adam.amp, adam.opt, &back), AMPC_EINVAL, "saved with optimizer sgd, the run uses adam");
  /* the same optimizer loads */
  CHECK_OK(ampc_checkpoint_load(ps, into.m, into.amp, into.opt, &back));
  CHECK(back.step == 2 && ampc_optim_step_count(into.opt) == 2);
  free(fresh);
  free(now);
  rig_free(&adam);
  rig_free(&sgd);
  rig_free(&into);
}

TEST_MAIN(TEST_ENTRY(roundtrip_continues_exactly), TEST_ENTRY(null_run_state_loads_back), TEST_ENTRY(roundtrip_on_the_guarded_backend),
          TEST_ENTRY(refuses_other_model_level_version), TEST_ENTRY(failed_write_keeps_previous_checkpoint),
          TEST_ENTRY(checks_shapes_and_ranges), TEST_ENTRY(refuses_a_missing_master), TEST_ENTRY(saves_a_scale_without_ceiling), TEST_ENTRY(refuses_another_optimizer))
