/* The preprocessing record of checkpoints: saved when set, read back
 * exactly, absent (and the caller's value kept) for checkpoints written
 * without it -- those of earlier versions -- and what
 * ampc_dataset_preprocessing() says for the real Fashion-MNIST. */
#include "ampc/checkpoint.h"
#include "ampc/safetensors.h"
#include "test.h"

typedef struct {
  ampc_model *m;
  ampc_optim *opt;
  ampc_amp *amp;
} rig;

static void rig_make(rig *r) {
  ampc_model_opts o = {.batch = 4, .channels = 1, .height = 8, .width = 8, .classes = 4, .seed = 3};
  CHECK_OK(ampc_model_create(&r->m, "mlp", &o));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  CHECK_OK(ampc_optim_create(&r->opt, &oc, ampc_graph_param_numel(ampc_model_graph(r->m))));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, AMPC_OPT_O2, AMPC_DTYPE_F16));
  CHECK_OK(ampc_amp_initialize(&r->amp, ampc_model_graph(r->m), r->opt, &ac));
}

static void rig_free(rig *r) {
  ampc_amp_free(r->amp);
  ampc_optim_free(r->opt);
  ampc_model_free(r->m);
}

static const char *tmp(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", AMPC_TEST_TMPDIR, name);
  return buf;
}

/* The checkpoint's "ampc" metadata (a JSON string), copied. */
static char *ampc_meta(const char *path) {
  ampc_st_file *f;
  char *copy = NULL;
  if (ampc_st_open(&f, path) == 0) {
    const char *js = ampc_st_metadata(f, "ampc");
    copy = js ? strdup(js) : NULL;
    ampc_st_close(f);
  }
  return copy;
}

TEST(saved_and_read_back) {
  rig a;
  rig_make(&a);
  ampc_train_state ts = {.seed = 1,
                         .preprocessing = {.dataset = "cifar10", .normalize = 1, .channels = 3, .height = 32, .width = 32,
                                           .mean = {0.4914f, 0.4822f, 0.4465f}, .std = {0.2470f, 0.2435f, 0.2616f}}};
  const char *path = tmp("prep.safetensors");
  CHECK_OK(ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts));
  char *js = ampc_meta(path);
  CHECK(js && strstr(js, "\"preprocessing\":{") && strstr(js, "\"dataset\":\"cifar10\"") && strstr(js, "\"shape\":[3,32,32]") &&
        strstr(js, "\"normalize\":true"));
  free(js);
  ampc_train_state back;
  memset(&back, 0, sizeof back);
  CHECK_OK(ampc_checkpoint_load(path, a.m, a.amp, a.opt, &back));
  CHECK(strcmp(back.preprocessing.dataset, "cifar10") == 0 && back.preprocessing.normalize == 1);
  CHECK(back.preprocessing.channels == 3 && back.preprocessing.height == 32 && back.preprocessing.width == 32);
  for (int c = 0; c < 3; c++) /* the float values exactly */
    CHECK_MSG(back.preprocessing.mean[c] == ts.preprocessing.mean[c] && back.preprocessing.std[c] == ts.preprocessing.std[c],
              "channel %d: %.9g/%.9g", c, back.preprocessing.mean[c], back.preprocessing.std[c]);
  rig_free(&a);
}

TEST(older_checkpoints_without_it_still_load) {
  rig a;
  rig_make(&a);
  ampc_train_state ts = {.seed = 2, .step = 5}; /* no preprocessing: what earlier versions wrote */
  const char *path = tmp("noprep.safetensors");
  CHECK_OK(ampc_checkpoint_save(path, a.m, a.amp, a.opt, &ts));
  char *js = ampc_meta(path);
  CHECK(js && !strstr(js, "preprocessing"));
  free(js);
  ampc_train_state back = {.preprocessing = {.dataset = "mnist", .normalize = 1, .channels = 1, .mean = {0.1307f}, .std = {0.3081f}}};
  CHECK_OK(ampc_checkpoint_load(path, a.m, a.amp, a.opt, &back));
  CHECK(back.step == 5 && back.seed == 2);
  CHECK(strcmp(back.preprocessing.dataset, "mnist") == 0 && back.preprocessing.mean[0] == 0.1307f); /* left as it was */
  rig_free(&a);
}

TEST(fashion_mnist_record) {
  ampc_dataset *d;
  if (ampc_dataset_open(&d, AMPC_DATASET_FASHION_MNIST, NULL, 0, 4) < 0) {
    printf("skipped: %s\n", ampc_last_error());
    return;
  }
  ampc_preprocessing p;
  ampc_dataset_preprocessing(d, 1, &p);
  CHECK(strcmp(p.dataset, "fashion-mnist") == 0 && p.normalize == 1 && p.channels == 1 && p.height == 28 && p.width == 28);
  CHECK(p.mean[0] == 0.2860f && p.std[0] == 0.3530f);
  ampc_dataset_preprocessing(d, 0, &p);
  CHECK(p.normalize == 0 && p.mean[0] == 0.0f && p.std[0] == 1.0f); /* x = pixel / 255 */
  ampc_dataset_free(d);
}

TEST_MAIN(TEST_ENTRY(saved_and_read_back), TEST_ENTRY(older_checkpoints_without_it_still_load), TEST_ENTRY(fashion_mnist_record))
