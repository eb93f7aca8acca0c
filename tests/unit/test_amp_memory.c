/* Memory accounting of a real model: ResNet-18 (CIFAR, batch 128) compiled
 * at O0 and at O2. Compiling allocates (and zeroes) every buffer, ~2 GB at
 * O0; nothing runs forward. */
#include <string.h>

#include "ampc/amp.h"
#include "ampc/nn.h"
#include "test.h"

static int account(ampc_opt_level lv, ampc_mem_report *rep) {
  ampc_model *m = NULL;
  ampc_model_opts o = {.batch = 128, .channels = 3, .height = 32, .width = 32, .classes = 10, .seed = 1};
  CHECK_OK(ampc_model_create(&m, "resnet18", &o));
  if (!m) return 0;
  ampc_graph *g = ampc_model_graph(m);
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_SGD);
  oc.lr = 0.1f;
  oc.momentum = 0.9f;
  ampc_optim *opt = NULL;
  CHECK_OK(ampc_optim_create(&opt, &oc, ampc_graph_param_numel(g)));
  ampc_amp_config cfg;
  CHECK_OK(ampc_amp_config_init(&cfg, lv, AMPC_DTYPE_F16));
  ampc_amp *a = NULL;
  CHECK_OK(ampc_amp_initialize(&a, g, opt, &cfg));
  int ok = a != NULL;
  if (a) ampc_amp_memory(a, rep);
  ampc_amp_free(a);
  ampc_optim_free(opt);
  ampc_model_free(m);
  return ok;
}

static size_t total_bytes(const ampc_mem_report *r) {
  size_t s = 0;
  for (int c = 0; c < AMPC_MEM_COUNT; c++) s += ampc_mem_total(r, (ampc_mem_category)c);
  return s;
}

static void print_report(const char *tag, const ampc_mem_report *r) {
  printf("  %s:\n", tag);
  for (int c = 0; c < AMPC_MEM_COUNT; c++) {
    printf("    %-16s %10.1f MiB", ampc_mem_category_name((ampc_mem_category)c),
           ampc_mem_total(r, (ampc_mem_category)c) / 1048576.0);
    for (int t = 0; t < AMPC_DTYPE_COUNT; t++)
      if (r->bytes[c][t]) printf("  %s %.1f", ampc_dtype_name((ampc_dtype)t), r->bytes[c][t] / 1048576.0);
    printf("\n");
  }
  printf("    %-16s %10.1f MiB\n", "total", total_bytes(r) / 1048576.0);
}

TEST(resnet18_o2_halves_activation_memory) {
  ampc_mem_report r0, r2;
  memset(&r0, 0, sizeof r0);
  memset(&r2, 0, sizeof r2);
  if (!account(AMPC_OPT_O0, &r0) || !account(AMPC_OPT_O2, &r2)) return;
  print_report("O0", &r0);
  print_report("O2", &r2);
  size_t a0 = ampc_mem_total(&r0, AMPC_MEM_ACTIVATIONS), a2 = ampc_mem_total(&r2, AMPC_MEM_ACTIVATIONS);
  double ratio = a0 ? (double)a2 / (double)a0 : 1.0;
  double tratio = (double)total_bytes(&r2) / (double)total_bytes(&r0);
  printf("  activations O2/O0 = %.3f, total training bytes O2/O0 = %.3f\n", ratio, tratio);
  CHECK(a0 > 0);
  CHECK_MSG(ratio <= 0.55, "activation bytes O2/O0 = %.3f (want <= 0.55)", ratio);
  /* O0 keeps no 16-bit storage at all; O2's activations are mostly f16 */
  for (int c = 0; c < AMPC_MEM_COUNT; c++) CHECK(r0.bytes[c][AMPC_DTYPE_F16] == 0 && r0.bytes[c][AMPC_DTYPE_BF16] == 0);
  CHECK(r2.bytes[AMPC_MEM_ACTIVATIONS][AMPC_DTYPE_F16] > r2.bytes[AMPC_MEM_ACTIVATIONS][AMPC_DTYPE_F32]);
  /* O2 adds f32 masters, one f32 copy of every parameter, the size of O0's
   * (f32) gradients; its gradients stay in the model's types (half, and f32
   * for batch norm) while one backward makes each step: no f32 copy of them */
  size_t f32_params = r0.bytes[AMPC_MEM_GRADIENTS][AMPC_DTYPE_F32];
  CHECK(ampc_mem_total(&r0, AMPC_MEM_MASTER_WEIGHTS) == 0);
  CHECK(r2.bytes[AMPC_MEM_MASTER_WEIGHTS][AMPC_DTYPE_F32] == f32_params);
  CHECK(r2.bytes[AMPC_MEM_GRADIENTS][AMPC_DTYPE_F32] < f32_params / 10);
  CHECK_MSG(tratio <= 0.65, "training bytes O2/O0 = %.3f (want <= 0.65)", tratio);
}

TEST_MAIN(TEST_ENTRY(resnet18_o2_halves_activation_memory))
