/* The public API given NULL handles, NULL out-pointers and out-of-range
 * values: an error status with a message (or, for a getter, a neutral value,
 * for a void function nothing), never a crash, an abort or a line printed. */
#include <stdint.h>
#include <string.h>

#include "ampc/ampc.h"
#include "ampc/amp.h"
#include "ampc/amp_config.h"
#include "ampc/checkpoint.h"
#include "ampc/data.h"
#include "ampc/nn.h"
#include "ampc/optim.h"
#include "ampc/safetensors.h"
#include "data/data_internal.h"
#include "test.h"

/* A call must fail (< 0) with a non-empty message. */
#define CHECK_FAILS(expr)                                                              \
  do {                                                                                 \
    ampc_status test__r = (expr);                                                      \
    const char *test__m = ampc_last_error();                                           \
    CHECK_MSG(test__r < 0 && test__m && test__m[0], "%s returned %d, message '%s'", #expr, \
              (int)test__r, test__m ? test__m : "(null)");                             \
  } while (0)

TEST(amp_null_handle) {
  float buf[4] = {0};
  CHECK_FAILS(ampc_amp_forward(NULL, 1));
  CHECK_FAILS(ampc_amp_backward(NULL, 0, 0, 0));
  ampc_amp_step_info info;
  CHECK_FAILS(ampc_amp_step(NULL, 0.1f, &info));
  CHECK_FAILS(ampc_amp_step(NULL, 0.1f, NULL));
  CHECK(ampc_amp_scaler(NULL, 0) == NULL);
  CHECK_FAILS(ampc_amp_param_values(NULL, buf));
  CHECK_FAILS(ampc_amp_load_params(NULL, buf));
  CHECK_FAILS(ampc_amp_read_master(NULL, "w", buf, 4));
  CHECK_FAILS(ampc_amp_write_master(NULL, "w", buf, 4));
  CHECK_FAILS(ampc_amp_read_optim_state(NULL, "exp_avg", "w", buf, 4));
  CHECK_FAILS(ampc_amp_unscaled_grads(NULL, buf, NULL));
  ampc_amp_set_loss_weight(NULL, 2.0f);
  ampc_amp_set_clip_grad_norm(NULL, 1.0f);
  ampc_amp_set_no_sync(NULL, 1);
  ampc_amp_set_grad_stats(NULL, 1);
  CHECK(ampc_amp_zero_stage(NULL) == 0);
  CHECK(ampc_amp_has_master_weights(NULL) == 0);
  CHECK(ampc_amp_get_config(NULL) == NULL);
  ampc_mem_report r;
  memset(&r, 0xff, sizeof r);
  ampc_amp_memory(NULL, &r);
  CHECK(r.bytes[AMPC_MEM_MASTER_WEIGHTS][AMPC_DTYPE_F32] == 0);
  ampc_amp_memory(NULL, NULL);
  CHECK_ERR(ampc_amp_set_bucket_bytes(NULL, 1 << 20), AMPC_EINVAL, "amp is NULL");
  CHECK_FAILS(ampc_amp_set_bucket_bytes(NULL, 1));
  CHECK_FAILS(ampc_amp_set_zero(NULL, 1));
  CHECK_FAILS(ampc_amp_sync_grads(NULL));
  CHECK_FAILS(ampc_amp_check_ranks(NULL));
}

TEST(amp_initialize_null) {
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16));
  ampc_graph *g = NULL;
  CHECK_OK(ampc_graph_create(&g));
  CHECK_FAILS(ampc_amp_initialize(NULL, g, NULL, &c));
  ampc_amp *a = (ampc_amp *)1;
  CHECK_ERR(ampc_amp_initialize(&a, NULL, NULL, &c), AMPC_EINVAL, "graph is NULL");
  CHECK(a == NULL);
  CHECK_FAILS(ampc_amp_initialize(&a, g, NULL, NULL));
  ampc_graph_free(g);
}

TEST(amp_config) {
  CHECK_FAILS(ampc_amp_config_init(NULL, AMPC_OPT_O1, AMPC_DTYPE_F16));
  CHECK_FAILS(ampc_opt_level_parse("O1", NULL));
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16));
  CHECK_ERR(ampc_amp_config_set(&c, "num_losses", "1000000000"), AMPC_EINVAL, "num_losses");
  CHECK_ERR(ampc_amp_config_set(&c, "num_losses", "1025"), AMPC_EINVAL, "num_losses");
  CHECK(c.num_losses == 1);
  CHECK_OK(ampc_amp_config_set(&c, "num_losses", "1024"));
  CHECK_OK(ampc_amp_config_validate(&c));
  c.num_losses = 1000000000;
  CHECK_ERR(ampc_amp_config_validate(&c), AMPC_EINVAL, "num_losses");
  CHECK(ampc_amp_config_uses_master_weights(NULL) == 0);
}

TEST(scaler_null) {
  /* used to print an internal error and abort */
  ampc_scaler_init(NULL, NULL);
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16));
  ampc_scaler_init(NULL, &c);
  ampc_scaler s;
  memset(&s, 0, sizeof s);
  ampc_scaler_init(&s, NULL);
  CHECK(s.st.scale == 0.0f);
  CHECK(ampc_scaler_update(NULL, 1) == 0);
  CHECK(ampc_scaler_update(NULL, 0) == 0);
  CHECK(ampc_scaler_scale(NULL) == 0.0f);
  CHECK(ampc_scaler_diverged(NULL, 1) == 0);
  ampc_scaler_get_state(NULL, NULL);
  CHECK_FAILS(ampc_scaler_set_state(NULL, NULL));
}

TEST(optim_null_and_step_bound) {
  float w[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, dst[4];
  CHECK_FAILS(ampc_optim_step(NULL, w, g, 0.1f));
  CHECK(ampc_optim_step_count(NULL) == 0);
  CHECK_FAILS(ampc_optim_set_step_count(NULL, 3));
  CHECK(ampc_optim_state_count(NULL) == 0);
  CHECK(ampc_optim_state_name(NULL, 0) == NULL);
  CHECK_FAILS(ampc_optim_state_read(NULL, 0, 0, 4, dst));
  CHECK(ampc_optim_numel(NULL) == 0);
  CHECK(ampc_optim_get_config(NULL) == NULL);
  ampc_optim_config_default(NULL, AMPC_OPTIM_ADAM);
  ampc_lr_schedule_default(NULL, AMPC_LR_COSINE);
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  CHECK_FAILS(ampc_optim_create(NULL, &oc, 4));
  ampc_optim *o = NULL;
  CHECK_OK(ampc_optim_create(&o, &oc, 4));
  if (!o) return;
  CHECK_FAILS(ampc_optim_state_read(o, 0, 0, 4, NULL));
  size_t k;
  CHECK_FAILS(ampc_optim_state_index(o, "exp_avg", NULL));
  CHECK_ERR(ampc_optim_state_index(o, NULL, &k), AMPC_EINVAL, "ampc_optim_state_index: name is NULL");
  CHECK_OK(ampc_optim_state_index(o, "exp_avg", &k));
  /* INT64_MAX used to be accepted and the next step overflowed */
  CHECK_ERR(ampc_optim_set_step_count(o, INT64_MAX), AMPC_ERANGE, "step count");
  CHECK_ERR(ampc_optim_set_step_count(o, ((int64_t)1 << 53) + 1), AMPC_ERANGE, "step count");
  CHECK(ampc_optim_step_count(o) == 0);
  CHECK_OK(ampc_optim_set_step_count(o, ((int64_t)1 << 53) - 1));
  CHECK_OK(ampc_optim_step(o, w, g, 0.1f));
  CHECK(ampc_optim_step_count(o) == (int64_t)1 << 53);
  CHECK_ERR(ampc_optim_step(o, w, g, 0.1f), AMPC_ERANGE, "step count");
  CHECK(ampc_optim_step_count(o) == (int64_t)1 << 53);
  ampc_optim_free(o);
}

TEST(safetensors_null) {
  CHECK(ampc_st_count(NULL) == 0);
  CHECK(ampc_st_get(NULL, 0) == NULL);
  CHECK(ampc_st_find(NULL, "w") == NULL);
  CHECK(ampc_st_metadata(NULL, "format") == NULL);
  CHECK(ampc_st_metadata_count(NULL) == 0);
  CHECK(ampc_st_metadata_key(NULL, 0) == NULL);
  CHECK(ampc_st_label(NULL) == NULL);
  const float v[3] = {1, 2, 3};
  const int32_t iv[3] = {1, 2, 3};
  ampc_st_tensor t = {.name = "w", .dtype = AMPC_DTYPE_F32, .ndim = 1, .shape = {3}, .values = v, .nbytes = sizeof v};
  ampc_st_tensor ti = {.name = "i", .dtype = AMPC_DTYPE_I32, .ndim = 1, .shape = {3}, .values = iv, .nbytes = sizeof iv};
  CHECK_FAILS(ampc_st_read_f32(&t, NULL, 3));
  CHECK_FAILS(ampc_st_read_i32(&ti, NULL, 3));
  CHECK_FAILS(ampc_st_read_f32(NULL, NULL, 3));
  float out[3];
  CHECK_OK(ampc_st_read_f32(&t, out, 3));
  CHECK(out[2] == 3.0f);
  int c, h, w, k;
  CHECK_FAILS(ampc_checkpoint_input(NULL, &c, &h, &w, &k));
}

TEST(data_null_and_bounds) {
  CHECK(ampc_dataset_count(NULL) == 0);
  CHECK(ampc_dataset_images(NULL) == NULL);
  CHECK(ampc_dataset_labels(NULL) == NULL);
  CHECK(ampc_dataset_channels(NULL) == 0);
  float mean[3], std[3];
  ampc_dataset_norm(NULL, mean, std);
  CHECK(mean[0] == 0.0f && std[0] == 1.0f);
  ampc_preprocessing p;
  ampc_dataset_preprocessing(NULL, 1, &p);
  CHECK(p.channels == 0);
  ampc_loader_opts_default(NULL);
  size_t order[4];
  CHECK_FAILS(ampc_loader_epoch_order(NULL, 0, order));
  CHECK(ampc_loader_batches_per_epoch(NULL) == 0);
  CHECK(ampc_loader_position(NULL) == 0);
  CHECK(ampc_loader_epoch(NULL) == -1);
  CHECK(ampc_loader_global_samples(NULL, 0) == 0);

  ampc_dataset *d = NULL;
  CHECK_FAILS(ampc__dataset_alloc(&d, AMPC_DATASET_MNIST, 4, 1, 0, 4, 10)); /* used to abort */
  CHECK_OK(ampc__dataset_alloc(&d, AMPC_DATASET_MNIST, 4, 1, 4, 4, 10));
  if (!d) return;
  ampc_loader_opts o;
  ampc_loader_opts_default(&o);
  o.background = 0;
  o.batch_size = 2;
  ampc_loader *l = NULL;
  CHECK_OK(ampc_loader_create(&l, d, &o));
  CHECK_FAILS(ampc_loader_epoch_order(l, 0, NULL));
  CHECK_OK(ampc_loader_epoch_order(l, 0, order));
  ampc_loader_free(l);
  o.random_crop_padding = INT32_MAX;
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "random_crop_padding");
  o.random_crop_padding = 65;
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "random_crop_padding");
  o.random_crop_padding = 64;
  CHECK_OK(ampc_loader_create(&l, d, &o));
  ampc_loader_free(l);
  l = NULL;
  o.random_crop_padding = 0;
  o.batch_size = INT32_MAX;
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "batch_size");
  o.batch_size = 65537;
  CHECK_ERR(ampc_loader_create(&l, d, &o), AMPC_EINVAL, "batch_size");
  CHECK(l == NULL);
  ampc_dataset_free(d);
}

/* A NULL name is an argument error naming the call (it was "no parameter
 * named ''", ENOTFOUND) */
TEST(null_names) {
  ampc_model *m = (ampc_model *)1;
  ampc_model_opts mo = {.batch = 2, .channels = 1, .height = 8, .width = 8, .classes = 4, .seed = 1};
  CHECK_ERR(ampc_model_create(&m, NULL, &mo), AMPC_EINVAL, "ampc_model_create: name is NULL");
  CHECK(m == NULL);
  CHECK_OK(ampc_model_create(&m, "mlp", &mo));
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_set_backend(g, "cpu", NULL));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  ampc_optim *o = NULL;
  CHECK_OK(ampc_optim_create(&o, &oc, ampc_graph_param_numel(g)));
  ampc_amp_config c;
  CHECK_OK(ampc_amp_config_init(&c, AMPC_OPT_O2, AMPC_DTYPE_F16));
  ampc_amp *a = NULL;
  CHECK_OK(ampc_amp_initialize(&a, g, o, &c));
  float buf[4] = {0};
  CHECK_ERR(ampc_amp_read_master(a, NULL, buf, 4), AMPC_EINVAL, "ampc_amp_read_master: name is NULL");
  CHECK_ERR(ampc_amp_write_master(a, NULL, buf, 4), AMPC_EINVAL, "ampc_amp_write_master: name is NULL");
  CHECK_ERR(ampc_amp_read_optim_state(a, NULL, "1.weight", buf, 4), AMPC_EINVAL, "ampc_amp_read_optim_state: state is NULL");
  CHECK_ERR(ampc_amp_write_optim_state(a, "exp_avg", NULL, buf, 4), AMPC_EINVAL, "ampc_amp_write_optim_state: name is NULL");
  ampc_amp_free(a);
  ampc_optim_free(o);
  ampc_model_free(m);
}

TEST(nn_and_models_null) {
  ampc_nn *b = (ampc_nn *)1;
  CHECK_FAILS(ampc_nn_create(NULL, NULL, 0));
  CHECK_ERR(ampc_nn_create(&b, NULL, 0), AMPC_EINVAL, "graph is NULL");
  CHECK(b == NULL);
  CHECK(ampc_nn_graph(NULL) == NULL);
  ampc_nn_push(NULL, "x");
  ampc_nn_pop(NULL);
  CHECK(ampc_nn_relu(NULL, 0) == AMPC_VALUE_NONE);
  CHECK(ampc_nn_linear(NULL, "fc", 0, 4, 1) == AMPC_VALUE_NONE);
  CHECK(ampc_nn_row_count(NULL) == 0);

  /* scopes nested too deep, or popped once too often: the graph fails */
  ampc_graph *g = NULL;
  CHECK_OK(ampc_graph_create(&g));
  CHECK_OK(ampc_nn_create(&b, g, 0));
  for (int i = 0; i < 9; i++) ampc_nn_push(b, "s");
  CHECK_ERR(ampc_graph_status(g), AMPC_EINVAL, "nested");
  for (int i = 0; i < 9; i++) ampc_nn_pop(b);
  ampc_nn_free(b);
  ampc_graph_free(g);
  CHECK_OK(ampc_graph_create(&g));
  CHECK_OK(ampc_nn_create(&b, g, 0));
  ampc_nn_pop(b);
  CHECK_ERR(ampc_graph_status(g), AMPC_EINVAL, "pop");
  ampc_nn_free(b);
  ampc_graph_free(g);

  ampc_model_opts mo = {.batch = 2, .channels = 1, .height = 4, .width = 4, .classes = 3, .seed = 1};
  CHECK_FAILS(ampc_model_create(NULL, "mlp", &mo));
  ampc_model *m = (ampc_model *)1;
  CHECK_ERR(ampc_model_create(&m, "mlp", NULL), AMPC_EINVAL, "NULL");
  CHECK(m == NULL);
  CHECK(ampc_model_graph(NULL) == NULL);
  CHECK(ampc_model_loss(NULL) == AMPC_VALUE_NONE);
  CHECK(ampc_model_param_count(NULL) == 0);
  CHECK(ampc_model_name(NULL) == NULL);
  ampc_eval_result er;
  CHECK_FAILS(ampc_model_evaluate(NULL, NULL, 0, &er));
}

TEST(checkpoint_null) {
  ampc_model_opts mo = {.batch = 2, .channels = 1, .height = 4, .width = 4, .classes = 3, .seed = 1};
  ampc_model *m = NULL;
  CHECK_OK(ampc_model_create(&m, "mlp", &mo));
  if (!m) return;
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, AMPC_OPT_O0, AMPC_DTYPE_F16));
  ampc_amp *a = NULL;
  CHECK_OK(ampc_amp_initialize(&a, ampc_model_graph(m), NULL, &ac));
  const char *path = AMPC_TEST_TMPDIR "/api_null.safetensors";
  CHECK_FAILS(ampc_checkpoint_save(NULL, m, a, NULL, NULL));
  CHECK_FAILS(ampc_checkpoint_save(path, NULL, a, NULL, NULL));
  CHECK_FAILS(ampc_checkpoint_save(path, m, NULL, NULL, NULL));
  CHECK_FAILS(ampc_checkpoint_save_weights(NULL, m, a, NULL));
  CHECK_FAILS(ampc_checkpoint_save_weights(path, NULL, a, NULL));
  CHECK_FAILS(ampc_checkpoint_load(path, NULL, a, NULL, NULL));
  CHECK_FAILS(ampc_checkpoint_load_weights(path, NULL, a));
  /* a NULL train state saves zeros, and loads back */
  CHECK_OK(ampc_checkpoint_save(path, m, a, NULL, NULL));
  ampc_train_state ts;
  memset(&ts, 0xff, sizeof ts);
  CHECK_OK(ampc_checkpoint_load(path, m, a, NULL, &ts));
  CHECK(ts.epoch == 0 && ts.step == 0 && ts.seen == 0);
  CHECK_OK(ampc_checkpoint_save_weights(path, m, NULL, NULL));
  ampc_st_file *f = NULL;
  CHECK_OK(ampc_st_open_header(&f, path));
  int c = 0, h = 0, w = 0, k = 0;
  CHECK_FAILS(ampc_checkpoint_input(f, NULL, &h, &w, &k));
  CHECK(ampc_checkpoint_input(f, &c, &h, &w, &k) == 1 && c == 1 && h == 4 && k == 3);
  ampc_st_close(f);
  ampc_amp_free(a);
  ampc_model_free(m);
}

/* The calls an audit found crashing, aborting or quietly succeeding */
TEST(more_null_and_bounds) {
  /* communicators: a NULL out-pointer; values NULL with n > 0 */
  CHECK_FAILS(ampc_comm_local_create(NULL, 2));
  CHECK_FAILS(ampc_comm_mpi_create(NULL));
  CHECK_FAILS(ampc_comm_mpi_create_from(NULL, NULL));
  CHECK_FAILS(ampc_comm_nccl_create(NULL, NULL));
  ampc_comm *one = NULL;
  CHECK_OK(ampc_comm_local_create(&one, 1));
  CHECK_FAILS(ampc_comm_allreduce_host(one, NULL, 3, AMPC_COMM_SUM));
  CHECK_OK(ampc_comm_allreduce_host(NULL, NULL, 0, AMPC_COMM_SUM));
  ampc_comm_free(one);
  CHECK_FAILS(ampc_lr_kind_parse("step", NULL));
  /* graph and backend */
  ampc_graph *g = NULL;
  CHECK_OK(ampc_graph_create(&g));
  CHECK_FAILS(ampc_graph_set_precision(g, NULL));
  ampc_graph_memory(g, NULL);
  ampc_graph_backend_stats(g, NULL, 1);
  ampc_backend_opts_default(NULL);
  ampc_graph_free(g);
  CHECK(ampc_amp_config_batchnorm_type(NULL) == AMPC_DTYPE_F32);
  char buf[16];
  CHECK(strcmp(ampc_shape_str(NULL, buf, sizeof buf), "(?)") == 0);
  ampc_rng r = {1, 0, 0};
  CHECK(ampc_rng_below(NULL, 5) == 0);
  CHECK(ampc_rng_below(&r, 0) == 0); /* (was a division by zero) */
  CHECK(ampc_rng_normal(NULL) == 0.0f);
  /* a sequential model with a layer kind that does not exist: an error, not the layer left out */
  ampc_nn *b = NULL;
  CHECK_OK(ampc_graph_create(&g));
  CHECK_OK(ampc_nn_create(&b, g, 0));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(2, 1, 4, 4));
  ampc_layer bad[] = {{.kind = AMPC_LAYER_FLATTEN}, {.kind = (ampc_layer_kind)77}};
  CHECK(ampc_nn_sequential(b, NULL, x, bad, 2) == AMPC_VALUE_NONE);
  CHECK_ERR(ampc_graph_status(g), AMPC_EINVAL, "layer 1 has an unknown kind 77");
  ampc_nn_free(b);
  ampc_graph_free(g);
  /* the loader's world_size: 0 or 1 is one process, a negative or absurd count an error */
  ampc_dataset *d = NULL;
  CHECK_OK(ampc__dataset_alloc(&d, AMPC_DATASET_MNIST, 4, 1, 2, 2, 10));
  ampc_loader_opts lo;
  ampc_loader_opts_default(&lo);
  lo.batch_size = 2;
  ampc_loader *l = NULL;
  lo.world_size = -3;
  CHECK_ERR(ampc_loader_create(&l, d, &lo), AMPC_EINVAL, "world_size -3");
  lo.world_size = 1 << 30;
  CHECK_ERR(ampc_loader_create(&l, d, &lo), AMPC_EINVAL, "world_size");
  lo.world_size = 0;
  CHECK_OK(ampc_loader_create(&l, d, &lo));
  ampc_loader_free(l);
  ampc_dataset_free(d);
}

TEST_MAIN(TEST_ENTRY(null_names), TEST_ENTRY(amp_null_handle), TEST_ENTRY(amp_initialize_null), TEST_ENTRY(amp_config),
          TEST_ENTRY(scaler_null), TEST_ENTRY(optim_null_and_step_bound), TEST_ENTRY(safetensors_null),
          TEST_ENTRY(data_null_and_bounds), TEST_ENTRY(nn_and_models_null), TEST_ENTRY(checkpoint_null),
          TEST_ENTRY(more_null_and_bounds))
