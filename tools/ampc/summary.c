/* ampc summary: layers, output shapes and parameter counts, like torchsummary. */
#include <string.h>

#include "session.h"

int cmd_summary(int argc, char **argv) {
  const char *model = "cnn";
  int channels = 0, size = 0, classes = 10;
  int64_t batch = 1;
  cli_opt opts[] = {
      {"--model", OPT_STRING, &model, "NAME", "mlp, cnn or resnet18 (default cnn)", 0, NULL},
      {"--channels", OPT_INT, &channels, "N", "input channels, 1..4096 (default: 1, or 3 for resnet18)", 1, NULL},
      {"--size", OPT_INT, &size, "N", "input height and width, 1..4096 (default: 28, or 32 for resnet18)", 1, NULL},
      {"--classes", OPT_INT, &classes, "N", "classes, 2..100000 (default 10)", 2, NULL},
      {"--batch-size", OPT_I64, &batch, "N", "batch shown in the output shapes, 1..4096 (default 1)", 1, NULL},
      {0},
  };
  int pr = cli_parse("summary", "--model NAME [options]", opts, argc, argv);
  if (pr) return pr > 0 ? 0 : 2;
  /* the summary builds the model: keep it to sizes that fit in memory */
  const struct {
    const char *flag;
    int64_t v, max;
  } lim[] = {{"--classes", classes, 100000}, {"--size", size, 4096}, {"--channels", channels, 4096}, {"--batch-size", batch, 4096}};
  for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
    if (lim[i].v > lim[i].max) {
      cli_error("%s: must be at most %lld for a summary, got %lld", lim[i].flag, (long long)lim[i].max, (long long)lim[i].v);
      return 2;
    }
  int is_resnet = strcmp(model, "resnet18") == 0;
  if (!channels) channels = is_resnet ? 3 : 1;
  if (!size) size = is_resnet ? 32 : 28;
  ampc_model_opts mo = {.batch = batch, .channels = channels, .height = size, .width = size, .classes = classes};
  ampc_model *m;
  if (ampc_model_create(&m, model, &mo) < 0) {
    /* a known model refuses the sizes (an input smaller than its pools) */
    cli_lib_error(ampc_model_known(model) ? "--size" : "--model");
    return 2;
  }
  const ampc_nn *b = ampc_model_builder(m);
  printf("%-36s %-18s %-22s %12s\n", "layer", "type", "output shape", "params");
  for (int i = 0; i < 92; i++) putchar('-');
  putchar('\n');
  for (size_t i = 0; i < ampc_nn_row_count(b); i++) {
    const ampc_nn_row *r = ampc_nn_row_at(b, i);
    char sh[64];
    printf("%-36s %-18s %-22s %12lld\n", r->name, r->kind, ampc_shape_str(&r->out, sh, sizeof sh), (long long)r->params);
  }
  for (int i = 0; i < 92; i++) putchar('-');
  putchar('\n');
  long long total = (long long)ampc_model_param_count(m);
  char buf[32];
  int len = snprintf(buf, sizeof buf, "%lld", total), o = 0;
  char grouped[48];
  for (int i = 0; i < len; i++) {
    grouped[o++] = buf[i];
    if ((len - i - 1) % 3 == 0 && i < len - 1) grouped[o++] = ',';
  }
  grouped[o] = '\0';
  printf("Total params: %s\nTrainable params: %s\nInput: (%lld, %d, %d, %d), %d classes\n", grouped, grouped, (long long)batch, channels, size, size, classes);
  ampc_model_free(m);
  return 0;
}
