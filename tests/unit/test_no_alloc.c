/* The training step allocates nothing after the first step: forward, backward
 * and the amp step run on memory planned at compile time. This executable
 * interposes malloc and friends to count calls while steps run. */
#include <stdatomic.h>
#include <stddef.h>

#include "ampc/ampc.h"
#include "test.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static atomic_int counting;
static atomic_long allocations;

void *malloc(size_t n) {
  if (counting) allocations++;
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  if (counting) allocations++;
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  if (counting) allocations++;
  return __libc_realloc(p, n);
}
void *aligned_alloc(size_t al, size_t n) {
  if (counting) allocations++;
  return __libc_memalign(al, n);
}
int posix_memalign(void **out, size_t al, size_t n) {
  if (counting) allocations++;
  *out = __libc_memalign(al, n);
  return *out ? 0 : 12;
}
void free(void *p) { __libc_free(p); }

static void steps_on(const char *backend, const char *model, int c, int hw, ampc_opt_level lvl, ampc_dtype half) {
  ampc_model_opts o = {.batch = 16, .channels = c, .height = hw, .width = hw, .classes = 10, .seed = 1};
  ampc_model *m;
  CHECK_OK(ampc_model_create(&m, model, &o));
  ampc_graph *g = ampc_model_graph(m);
  CHECK_OK(ampc_graph_set_backend(g, backend, NULL));
  ampc_optim_config oc;
  ampc_optim_config_default(&oc, AMPC_OPTIM_ADAM);
  ampc_optim *opt;
  CHECK_OK(ampc_optim_create(&opt, &oc, ampc_graph_param_numel(g)));
  ampc_amp_config ac;
  CHECK_OK(ampc_amp_config_init(&ac, lvl, half));
  ampc_amp *amp;
  CHECK_OK(ampc_amp_initialize(&amp, g, opt, &ac));
  ampc_amp_set_clip_grad_norm(amp, 5.0f);
  ampc_tensor x = ampc_graph_tensor(g, ampc_model_input(m));
  ampc_rng r = ampc_rng_make(2, AMPC_RNG_STREAM_USER);
  float buf[16 * 3 * 32 * 32];
  int32_t lab[16];
  size_t nx = (size_t)ampc_tensor_numel(&x);
  for (size_t i = 0; i < nx; i++) buf[i] = ampc_rng_normal(&r);
  for (int i = 0; i < 16; i++) lab[i] = i % 10;
  long before = 0;
  ampc_backend_stats bs;
  int clean_steps = 0;
  for (int step = 0; step < 4; step++) {
    if (step == 1) {
      before = allocations;
      counting = 1;
    }
    ampc_graph_set_batch(g, step == 3 ? 12 : 16); /* a short final batch too */
    /* the step proper: the batch in, forward, backward, the amp step */
    CHECK_OK(ampc_graph_write(g, ampc_model_input(m), buf, AMPC_DTYPE_F32));
    CHECK_OK(ampc_graph_write(g, ampc_model_labels(m), lab, AMPC_DTYPE_I32));
    CHECK_OK(ampc_amp_forward(amp, 1));
    CHECK_OK(ampc_amp_backward(amp, ampc_model_loss(m), 0, 0));
    ampc_graph_backend_stats(g, &bs, 1);
    ampc_amp_step_info info;
    CHECK_OK(ampc_amp_step(amp, 1e-3f, &info));
    /* one small read back from the device decides the step (an overflowing
     * one reads which parameters overflowed too) */
    ampc_graph_backend_stats(g, &bs, 0);
    CHECK_MSG(bs.reads == (info.found_inf ? 2 : 1), "%s %s/%s: the step made %lld device-to-host reads", model,
              ampc_opt_level_name(lvl), ampc_dtype_name(half), (long long)bs.reads);
    clean_steps += !info.found_inf;
  }
  counting = 0;
  CHECK_MSG(clean_steps > 0 || lvl == AMPC_OPT_O1 || lvl == AMPC_OPT_O2, "%s %s: every step overflowed", model,
            ampc_opt_level_name(lvl));
  long n = allocations - before;
  CHECK_MSG(n == 0, "%s on %s, %s/%s: %ld heap allocations in 3 training steps after the first", model, backend,
            ampc_opt_level_name(lvl), ampc_dtype_name(half), n);
  ampc_amp_free(amp);
  ampc_optim_free(opt);
  ampc_model_free(m);
}

static void steps_allocate_nothing(const char *model, int c, int hw, ampc_opt_level lvl, ampc_dtype half) {
  steps_on("cpu", model, c, hw, lvl, half);
}

TEST(cnn_steps_allocate_nothing) {
  steps_on("cpu-guarded", "cnn", 1, 28, AMPC_OPT_O2, AMPC_DTYPE_F16);
  steps_allocate_nothing("cnn", 1, 28, AMPC_OPT_O0, AMPC_DTYPE_F16);
  steps_allocate_nothing("cnn", 1, 28, AMPC_OPT_O1, AMPC_DTYPE_F16);
  steps_allocate_nothing("cnn", 1, 28, AMPC_OPT_O2, AMPC_DTYPE_F16);
  steps_allocate_nothing("cnn", 1, 28, AMPC_OPT_O3, AMPC_DTYPE_BF16);
}

TEST(resnet18_steps_allocate_nothing) { steps_allocate_nothing("resnet18", 3, 16, AMPC_OPT_O2, AMPC_DTYPE_F16); }

TEST_MAIN(TEST_ENTRY(cnn_steps_allocate_nothing), TEST_ENTRY(resnet18_steps_allocate_nothing))
