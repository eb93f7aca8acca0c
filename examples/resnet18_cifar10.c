/*
 * resnet18_cifar10.c -- the apex mixed-precision example, in C.
 *
 * Trains the CIFAR ResNet-18 on CIFAR-10 with Adam (lr 1e-3, batch 128) under
 * an apex opt level (O2 by default), then evaluates it on the test set. It is
 * the C form of this PyTorch + apex program; the comments marked "apex:" or
 * "torch:" below name the Python line each C call stands for.
 *
 *     model = ResNet18().cuda()
 *     optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
 *     model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
 *     for images, labels in train_loader:        # RandomCrop(32, 4), RandomHorizontalFlip
 *         optimizer.zero_grad()
 *         loss = F.cross_entropy(model(images), labels)
 *         with amp.scale_loss(loss, optimizer) as scaled_loss:
 *             scaled_loss.backward()
 *         optimizer.step()
 *
 * Build: cmake --build build --target resnet18_cifar10
 * Run:   build/examples/resnet18_cifar10 --data data/cifar-10-batches-bin --steps 500
 *
 * Options: --data DIR (the CIFAR-10 binary folder), --steps N (optimizer
 * steps; default one epoch), --batch N (128), --opt-level O0|O1|O2|O3 (O2),
 * --half f16|bf16 (f16), --test-limit N (evaluate on the first N test images;
 * default all), --log-every N (10), --seed N (0).
 *
 * Every library call returns 0 or a negative ampc_status; on failure the
 * program prints ampc_last_error() and exits with status 1 (2 for a bad
 * command line).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ampc/amp.h"
#include "ampc/data.h"
#include "ampc/nn.h"
#include "ampc/version.h"
#include "ampc/optim.h"
#include "ampc/status.h"

static const char *prog = "resnet18_cifar10";

typedef struct {
  const char *data_dir;   /* NULL: the library's default, data/cifar-10-batches-bin */
  long long steps;        /* 0: one epoch */
  long long batch;
  const char *opt_level;
  const char *half;
  long long test_limit;   /* 0: the whole test set */
  long long log_every;
  long long seed;
} args;

static void usage(FILE *f) {
  fprintf(f,
          "usage: %s [--data DIR] [--steps N] [--batch N] [--opt-level O0|O1|O2|O3]\n"
          "       [--half f16|bf16] [--test-limit N] [--log-every N] [--seed N]\n"
          "  --data DIR        CIFAR-10 binary folder (data_batch_1.bin .. test_batch.bin;\n"
          "                    default data/cifar-10-batches-bin)\n"
          "  --steps N         optimizer steps (default: one epoch)\n"
          "  --batch N         images per batch (default 128)\n"
          "  --opt-level L     apex opt level (default O2)\n"
          "  --half T          the 16-bit type (default f16)\n"
          "  --test-limit N    evaluate on the first N test images (default: all)\n"
          "  --log-every N     print a progress line every N steps (default 10)\n"
          "  --seed N          seed of initialisation, shuffling and augmentation (default 0)\n",
          prog);
}

/* A whole decimal number in [min, max], or -1 with a message. */
static int parse_count(const char *flag, const char *v, long long min, long long max, long long *out) {
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (!*v || *end || errno || x < min || x > max) {
    fprintf(stderr, "%s: error: %s: expected an integer in [%lld, %lld], got '%s'\n", prog, flag, min, max, v);
    return -1;
  }
  *out = x;
  return 0;
}

static int parse_args(int argc, char **argv, args *a) {
  *a = (args){.data_dir = NULL, .steps = 0, .batch = 128, .opt_level = "O2", .half = "f16",
              .test_limit = 0, .log_every = 10, .seed = 0};
  static const char *const known[] = {"--data", "--steps", "--batch", "--opt-level", "--half", "--test-limit", "--log-every", "--seed"};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    int is_known = 0;
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) is_known |= strcmp(f, known[k]) == 0;
    if (!is_known) {
      if (strncmp(f, "-", 1) == 0) fprintf(stderr, "%s: error: unknown option '%s' (see --help)\n", prog, f);
      else fprintf(stderr, "%s: error: unexpected argument '%s' (see --help)\n", prog, f);
      return -1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: error: %s: missing value\n", prog, f);
      return -1;
    }
    const char *v = argv[++i];
    int rc = 0;
    if (strcmp(f, "--data") == 0) a->data_dir = v;
    else if (strcmp(f, "--steps") == 0) rc = parse_count(f, v, 1, LLONG_MAX / 2, &a->steps);
    else if (strcmp(f, "--batch") == 0) rc = parse_count(f, v, 2, 1 << 16, &a->batch); /* batch norm needs 2 */
    else if (strcmp(f, "--opt-level") == 0) a->opt_level = v;
    else if (strcmp(f, "--half") == 0) a->half = v;
    else if (strcmp(f, "--test-limit") == 0) rc = parse_count(f, v, 1, LLONG_MAX / 2, &a->test_limit);
    else if (strcmp(f, "--log-every") == 0) rc = parse_count(f, v, 1, LLONG_MAX / 2, &a->log_every);
    else rc = parse_count(f, v, 0, LLONG_MAX, &a->seed); /* --seed */
    if (rc < 0) return -1;
  }
  return 0;
}

/* Reports a failed library call: what the program was doing, then the
 * library's one-line message. */
static int fail(const char *what) {
  fprintf(stderr, "%s: error: %s: %s\n", prog, what, ampc_last_error());
  return 1;
}

/* Wall-clock seconds (C11's timespec_get: no POSIX needed). */
static double now_s(void) {
  struct timespec t;
  timespec_get(&t, TIME_UTC);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  args a;
  if (parse_args(argc, argv, &a) < 0) return 2;

  /* The amp configuration first, so that a bad --opt-level or --half is
   * reported before any data is read. */
  ampc_opt_level level;
  ampc_dtype half;
  if (ampc_opt_level_parse(a.opt_level, &level) < 0) {
    fail("--opt-level");
    return 2;
  }
  if (ampc_dtype_parse(a.half, &half) < 0 || (half != AMPC_DTYPE_F16 && half != AMPC_DTYPE_BF16)) {
    fprintf(stderr, "%s: error: --half: expected f16 or bf16, got '%s'\n", prog, a.half);
    return 2;
  }
  ampc_amp_config acfg;
  /* apex: the opt_level="O2" argument of amp.initialize. Overrides (apex's
   * keyword arguments, e.g. loss_scale=128.0) would follow as
   * ampc_amp_config_set(&acfg, "loss_scale", "128"). */
  if (ampc_amp_config_init(&acfg, level, half) < 0 || ampc_amp_config_validate(&acfg) < 0) {
    fail("amp config");
    return 2;
  }

  int rc = 0;
  ampc_dataset *train = NULL, *test = NULL;
  ampc_model *model = NULL;
  ampc_optim *opt = NULL;
  ampc_amp *amp = NULL;
  ampc_loader *ld = NULL;
  void *x = NULL;   /* one batch of images, (N, 3, 32, 32) in the model's input type */
  int32_t *y = NULL; /* its labels */

  /* torchvision: datasets.CIFAR10(root, train=True/False). Fully read into memory. */
  if (ampc_dataset_open(&train, AMPC_DATASET_CIFAR10, a.data_dir, 1, 0) < 0) {
    rc = fail("training set");
    goto done;
  }
  if (ampc_dataset_open(&test, AMPC_DATASET_CIFAR10, a.data_dir, 0, (size_t)a.test_limit) < 0) {
    rc = fail("test set");
    goto done;
  }

  /* torch: model = ResNet18(). The graph is recorded for this batch shape;
   * parameters get PyTorch's state_dict names and initialisation. */
  ampc_model_opts mo = {.batch = a.batch, .channels = 3, .height = 32, .width = 32, .classes = 10,
                        .seed = (uint64_t)a.seed, .label_smoothing = 0.0f};
  if (ampc_model_create(&model, "resnet18", &mo) < 0) {
    rc = fail("model");
    goto done;
  }
  ampc_graph *g = ampc_model_graph(model);

  /* torch: optimizer = torch.optim.Adam(model.parameters(), lr=1e-3).
   * Its state (exp_avg, exp_avg_sq) is f32 and indexed like the flat
   * parameter array. */
  ampc_optim_config ocfg;
  ampc_optim_config_default(&ocfg, AMPC_OPTIM_ADAM); /* lr 1e-3, betas (0.9, 0.999), eps 1e-8 */
  if (ampc_optim_create(&opt, &ocfg, ampc_graph_param_numel(g)) < 0) {
    rc = fail("optimizer");
    goto done;
  }

  /* apex: model, optimizer = amp.initialize(model, optimizer, opt_level=...).
   * Decides every tensor's storage type (O2: half weights and activations,
   * f32 batch norm, f32 master weights in the amp handle), then compiles the
   * graph: backward derived, all buffers planned and allocated. */
  if (ampc_amp_initialize(&amp, g, opt, &acfg) < 0) {
    rc = fail("amp initialize");
    goto done;
  }

  /* torch: DataLoader(train_set, batch_size=128, shuffle=True, drop_last=True)
   * with transforms RandomCrop(32, padding=4), RandomHorizontalFlip(),
   * ToTensor(), Normalize(mean, std). The loader fills host memory of ours
   * with x in the model input's storage type -- at O2/O3 the half type (apex
   * casts the model's inputs to half), at O0/O1 f32 -- and y as int32. */
  ampc_value xv = ampc_model_input(model), yv = ampc_model_labels(model), lossv = ampc_model_loss(model);
  ampc_loader_opts lo;
  ampc_loader_opts_default(&lo);
  lo.batch_size = (int)a.batch;
  lo.seed = (uint64_t)a.seed;
  lo.shuffle = 1;
  lo.drop_last = 1; /* every step a full batch */
  lo.random_crop_padding = 4;
  lo.hflip = 1;
  lo.dtype = ampc_graph_tensor(g, xv).dtype;
  x = malloc((size_t)a.batch * 3 * 32 * 32 * ampc_dtype_size(lo.dtype));
  y = malloc((size_t)a.batch * sizeof *y);
  if (!x || !y) {
    fprintf(stderr, "%s: error: out of memory for a batch\n", prog);
    rc = 1;
    goto done;
  }
  if (ampc_loader_create(&ld, train, &lo) < 0) {
    rc = fail("training loader");
    goto done;
  }
  int64_t per_epoch = ampc_loader_batches_per_epoch(ld);
  if (per_epoch < 1) {
    fprintf(stderr, "%s: error: %zu training images are fewer than one batch of %lld\n", prog,
            ampc_dataset_count(train), a.batch);
    rc = 1;
    goto done;
  }
  int64_t steps = a.steps > 0 ? a.steps : per_epoch;

  char desc[512];
  ampc_amp_config_describe(&acfg, desc, sizeof desc);
  ampc_mem_report mem;
  ampc_amp_memory(amp, &mem);
  size_t mem_total = 0;
  for (int c = 0; c < AMPC_MEM_COUNT; c++) mem_total += ampc_mem_total(&mem, (ampc_mem_category)c);
  /* OpenBLAS chooses its kernels as it is loaded; on a CPU model it does not
   * know it runs its SSE3 ones, and only the environment can change that */
  const char *core = ampc_blas_better_core();
  if (core)
    fprintf(stderr, "note: OpenBLAS runs its %s kernels on this CPU; OPENBLAS_CORETYPE=%s makes the products faster\n",
            ampc_blas_core(), core);
  printf("resnet18: %lld parameters, %zu train / %zu test images, batch %lld, %lld steps, Adam lr %g\n",
         (long long)ampc_model_param_count(model), ampc_dataset_count(train), ampc_dataset_count(test), a.batch,
         (long long)steps, (double)ocfg.lr);
  printf("amp: %s\n", desc);
  printf("memory: %.1f MB (master weights %.1f MB, activations %.1f MB)\n", (double)mem_total / 1e6,
         (double)ampc_mem_total(&mem, AMPC_MEM_MASTER_WEIGHTS) / 1e6,
         (double)ampc_mem_total(&mem, AMPC_MEM_ACTIVATIONS) / 1e6);
  fflush(stdout);

  int64_t epoch = 0, skipped = 0, since_print = 0, images = 0;
  double loss_sum = 0.0, t_print = now_s();
  if (ampc_loader_start_epoch(ld, epoch, 0) < 0) { /* torch: for images, labels in train_loader: */
    rc = fail("training loader");
    goto done;
  }
  for (int64_t step = 1; step <= steps; step++) {
    /* The next batch into host memory, then onto the device: the graph's
     * input and labels (torch: images.cuda(), labels.cuda()). */
    int n = 0;
    if (ampc_loader_next(ld, x, y, &n) < 0) {
      rc = fail("training batch");
      goto done;
    }
    if (n == 0) { /* end of the epoch: start the next one (a new shuffle) */
      if (ampc_loader_start_epoch(ld, ++epoch, 0) < 0 || ampc_loader_next(ld, x, y, &n) < 0) {
        rc = fail("training batch");
        goto done;
      }
    }
    if (ampc_graph_write(g, xv, x, lo.dtype) < 0 || ampc_graph_write(g, yv, y, AMPC_DTYPE_I32) < 0) {
      rc = fail("training batch");
      goto done;
    }

    /* optimizer.zero_grad() has no call of its own: ampc_amp_step() clears
     * the gradients, and a backward with accumulate = 0 overwrites them. */

    /* torch: loss = F.cross_entropy(model(images), labels). Training mode:
     * batch norm uses batch statistics and updates its running ones. */
    if (ampc_amp_forward(amp, 1) < 0) {
      rc = fail("forward");
      goto done;
    }
    float loss; /* torch: loss.item() */
    if (ampc_graph_read(g, lossv, &loss, AMPC_DTYPE_F32) < 0) {
      rc = fail("forward");
      goto done;
    }

    /* apex: with amp.scale_loss(loss, optimizer) as scaled_loss:
     *           scaled_loss.backward()
     * Backward from loss * scale (loss 0, not accumulating). At O2 the half
     * gradients are folded into f32 master gradients; they stay scaled until
     * the step. */
    if (ampc_amp_backward(amp, lossv, 0, 0) < 0) {
      rc = fail("backward");
      goto done;
    }

    /* apex: optimizer.step(). One pass unscales and checks every gradient
     * for inf/NaN; if all are finite a fused pass runs Adam on the f32
     * masters and writes the half model copy. An overflowing step is
     * skipped -- weights, Adam moments and step count untouched -- and the
     * loss scale halves. Either way the gradients are cleared. */
    ampc_amp_step_info info;
    if (ampc_amp_step(amp, ocfg.lr, &info) < 0) {
      rc = fail("step");
      goto done;
    }
    if (!info.applied) {
      /* apex: "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to ..." */
      skipped++;
      printf("step %lld: gradient overflow, step skipped, loss scale now %g (%d parameter%s with inf/NaN gradients, first %s)\n",
             (long long)step, (double)info.scale, info.n_nonfinite, info.n_nonfinite == 1 ? "" : "s",
             info.n_nonfinite > 0 && info.nonfinite[0] ? info.nonfinite[0] : "?");
      /* Halving cannot go on helping: many overflows in a row at the
       * minimum scale (for a static scale: any overflows in a row) mean the
       * model itself produces inf/NaN. */
      if (ampc_scaler_diverged(ampc_amp_scaler(amp, 0), 20)) {
        fprintf(stderr, "%s: error: training diverged: 20 overflowing steps in a row at the minimum loss scale %g\n",
                prog, (double)info.scale);
        rc = 1;
        goto done;
      }
    }

    loss_sum += loss;
    since_print++;
    images += n;
    if (step % a.log_every == 0 || step == steps || step == 1) {
      double t = now_s(), dt = t - t_print;
      printf("step %lld/%lld epoch %lld: loss %.4f loss_scale %g %.1f img/s\n", (long long)step, (long long)steps,
             (long long)epoch + 1, loss_sum / (double)since_print, (double)ampc_scaler_scale(ampc_amp_scaler(amp, 0)),
             dt > 0 ? (double)images / dt : 0.0);
      fflush(stdout);
      loss_sum = 0.0;
      since_print = 0;
      images = 0;
      t_print = t;
    }
  }

  /* torch: model.eval(); the test loop (with torch.no_grad(): model(x)):
   * mean cross entropy and top-1 accuracy, batch norm on its running
   * statistics, the model in its training storage types. */
  ampc_eval_result ev;
  if (ampc_model_evaluate(model, test, lo.normalize, &ev) < 0) {
    rc = fail("evaluate");
    goto done;
  }
  printf("test: loss %.4f accuracy %.4f on %zu images; %lld of %lld steps skipped, final loss scale %g\n", ev.loss,
         ev.accuracy, ev.images, (long long)skipped, (long long)steps, (double)ampc_scaler_scale(ampc_amp_scaler(amp, 0)));

done:
  /* Free in the reverse order of creation: the loader before the dataset it
   * reads, the amp handle before the graph and optimizer it uses. */
  ampc_loader_free(ld);
  free(x);
  free(y);
  ampc_amp_free(amp);
  ampc_optim_free(opt);
  ampc_model_free(model);
  ampc_dataset_free(test);
  ampc_dataset_free(train);
  return rc;
}
