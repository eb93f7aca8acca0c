/* ampc eval: test loss and accuracy of saved weights. */
#include <jansson.h>
#include <string.h>

#include "session.h"

/* The normalisation the weights were trained with, from their preprocessing
 * record: 1 or 0, -1 when they record none, -2 after an error (a malformed
 * record). */
static int recorded_normalize(const char *path, char *dataset, size_t len) {
  ampc_st_file *f;
  dataset[0] = '\0';
  if (ampc_st_open_header(&f, path) < 0) return -1;
  json_t *p = NULL;
  if (cli_file_preprocessing(f, "--weights", path, &p) < 0) {
    ampc_st_close(f);
    return -2;
  }
  json_t *nz = json_object_get(p, "normalize");
  const char *ds = json_string_value(json_object_get(p, "dataset"));
  snprintf(dataset, len, "%s", ds ? ds : "");
  int r = json_is_boolean(nz) ? json_is_true(nz) : -1;
  json_decref(p);
  ampc_st_close(f);
  return r;
}

int cmd_eval(int argc, char **argv) {
  cli_common c;
  cli_common_defaults(&c);
  const char *weights = NULL;
  cli_opt opts[48];
  int n = cli_common_opts(&c, opts, CLI_OPTS_DATA | CLI_OPTS_BATCH | CLI_OPTS_PRECISION);
  opts[n++] = (cli_opt){"--weights", OPT_STRING, &weights, "FILE", "weights or checkpoint (safetensors), required", 0, NULL};
  opts[n] = (cli_opt){0};
  int pr = cli_parse("eval", "--weights FILE [options]", opts, argc, argv);
  if (pr) return pr > 0 ? 0 : 2;
  if (!weights) {
    cli_error("eval: --weights FILE is required");
    return 2;
  }
  ampc_amp_config acfg;
  int cc = cli_common_check(&c, &acfg);
  if (cc < 0) return cc == -2 ? 1 : 2;
  cli_session s;
  int rc = cli_session_open(&s, &c, 0, 1, NULL, NULL, c.batch_size, "--weights", weights) < 0 || cli_load_weights(&s, weights) < 0;
  double loss = 0, acc = 0;
  char ds[64];
  int rec = rc ? -1 : recorded_normalize(weights, ds, sizeof ds);
  if (rec == -2) rc = 1;
  if (rec >= 0 && rec != (s.normalize != 0))
    fprintf(stderr, "ampc: warning: eval: %s was trained %s per-channel normalisation%s%s, and this evaluation runs with --normalize %s\n",
            cli_shown(weights), rec ? "with" : "without", ds[0] ? " of " : "", cli_shown(ds), s.normalize ? "on" : "off");
  const char *here = cli_dataset_name(&c);
  if (rec == 1 && s.normalize && ds[0] && strcmp(ds, here) != 0)
    /* each dataset is normalised with its own mean and std */
    fprintf(stderr, "ampc: warning: eval: %s was trained on %s, normalised with its mean and std, and this evaluation normalises "
                    "with %s's (--dataset)\n", cli_shown(weights), cli_shown(ds), here);
  if (!rc) rc = cli_evaluate(&s, s.test, &loss, &acc) < 0;
  if (!rc) printf("test_loss %.4f test_acc %.4f images %zu\n", loss, acc, ampc_dataset_count(s.test));
  cli_session_close(&s);
  return rc ? 1 : 0;
}
