/* ampc train: the training loop, progress and per-epoch metrics. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ampc/checkpoint.h"
#include "ckptdir.h"
#include "session.h"
#include "train_args.h"

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { stop_requested = sig; }

#define CKPT_PREFIX "ckpt-step-"
#define CKPT_SUFFIX ".safetensors"

static int save_checkpoint(cli_session *s, const char *dir, int keep, const ampc_train_state *ts, int quiet) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    cli_error("--checkpoint-dir: cannot create '%s': %s", dir, strerror(errno));
    return -1;
  }
  char path[4096];
  cli_checkpoint_path(path, sizeof path, dir, (long long)ts->step);
  if (ampc_checkpoint_save(path, s->model, s->amp, s->opt, ts) < 0) {
    cli_lib_error("saving checkpoint");
    return -1;
  }
  if (!quiet) fprintf(stderr, "ampc: saved %s\n", path);
  if (keep > 0) cli_prune_checkpoints(dir, keep);
  return 0;
}


static void progress(int tty, int epoch, int64_t b, int64_t nb, double loss, double ips, double eta) {
  if (tty) {
    int width = 30, filled = nb ? (int)(width * b / nb) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\repoch %d [%s] %lld/%lld loss %.4f %.1f img/s ETA %.0fs ", epoch, bar, (long long)b, (long long)nb, loss, ips, eta);
    fflush(stderr);
  } else {
    fprintf(stderr, "epoch %d: batch %lld/%lld loss %.4f %.1f img/s ETA %.0fs\n", epoch, (long long)b, (long long)nb, loss, ips, eta);
  }
}

/* Where a batch goes on its way to the device: host memory the loader
 * fills, written into the graph's input and labels. */
typedef struct {
  void *x;
  int32_t *y;
} staging;

static int staging_make(staging *st, cli_session *s, ampc_dtype xtype) {
  ampc_tensor x = ampc_graph_tensor(s->g, ampc_model_input(s->model));
  int64_t B = ampc_graph_max_batch(s->g);
  st->x = malloc((size_t)ampc_tensor_numel(&x) / (size_t)ampc_graph_batch(s->g) * (size_t)B * ampc_dtype_size(xtype));
  st->y = malloc((size_t)B * sizeof *st->y);
  if (!st->x || !st->y) {
    cli_error("out of memory for the batch");
    return -1;
  }
  return 0;
}

int cmd_train(int argc, char **argv) {
  train_args a;
  train_args_init(&a);
  cli_opt opts[64];
  train_args_opts(&a, opts);
  int pr = cli_parse("train", "[options]", opts, argc, argv);
  if (pr) return pr > 0 ? 0 : 2;

  ampc_optim_config ocfg;
  ampc_lr_schedule sched;
  int skip_nonfinite;
  if (train_args_check(&a, &ocfg, &sched, &skip_nonfinite) < 0) return 2;
  /* one run per checkpoint folder: found out before anything else is done */
  if (a.checkpoint_dir && cli_ckptdir_lock("--checkpoint-dir", a.checkpoint_dir) < 0) return 1;
  char resume_path[4096] = "";
  if (a.resume) {
    struct stat sb;
    if (stat(a.resume, &sb) != 0) {
      cli_error("--resume: '%s': %s", a.resume, strerror(errno));
      return 1;
    }
    if (S_ISDIR(sb.st_mode)) {
      if (cli_latest_checkpoint(a.resume, resume_path, sizeof resume_path) < 0) {
        cli_error("--resume: no checkpoint (" CKPT_PREFIX "*" CKPT_SUFFIX ") in '%s'", a.resume);
        return 1;
      }
    } else {
      snprintf(resume_path, sizeof resume_path, "%s", a.resume);
    }
  }
  if (a.save) {
    /* find out now, not after training, that the weights cannot be written */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", a.save);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    if (access(slash ? (dir[0] ? dir : "/") : ".", W_OK) != 0) {
      cli_error("--save: cannot write into the folder of '%s': %s", a.save, strerror(errno));
      return 1;
    }
  }

  /* from here on, every exit goes through the one clean-up at the end */
  int rc = 1;
  FILE *mf = NULL;
  ampc_loader *ld = NULL;
  staging in = {NULL, NULL};
  cli_session s;
  memset(&s, 0, sizeof s);
  if (a.metrics && !(mf = cli_open_output("--metrics", a.metrics, a.resume != NULL))) goto done;
  if (cli_session_open(&s, &a.c, 1, 1, NULL, &ocfg, a.c.batch_size, "--resume", resume_path[0] ? resume_path : NULL) < 0 ||
      cli_check_grad_accum(a.c.grad_accum, ampc_dataset_count(s.train), a.c.batch_size) < 0)
    goto done;
  int is_cifar = strncmp(a.c.dataset, "cifar", 5) == 0;
  int augment = a.augment_given ? a.augment : is_cifar;
  ampc_loader_opts lo;
  ampc_loader_opts_default(&lo);
  lo.batch_size = (int)a.c.batch_size;
  lo.seed = a.c.seed;
  lo.normalize = a.c.normalize;
  lo.random_crop_padding = augment ? 4 : 0;
  lo.hflip = augment;
  ampc_value xv = ampc_model_input(s.model), yv = ampc_model_labels(s.model), lossv = ampc_model_loss(s.model);
  lo.dtype = ampc_graph_tensor(s.g, xv).dtype; /* the loader converts as it goes: the write copies */
  if (staging_make(&in, &s, lo.dtype) < 0) goto done;
  if (ampc_loader_create(&ld, s.train, &lo) < 0) {
    cli_lib_error(NULL);
    goto done;
  }
  char desc[512];
  ampc_amp_config_describe(&s.amp_cfg, desc, sizeof desc);
  ampc_mem_report mem;
  ampc_amp_memory(s.amp, &mem);
  if (!a.quiet) {
    int cuda = strcmp(ampc_graph_backend_name(s.g), "cuda") == 0;
    fprintf(stderr, "ampc: model %s (%lld parameters), %s %zu train / %zu test images, batch %lld, %s, device %s%s\n",
            ampc_model_name(s.model), (long long)ampc_model_param_count(s.model), a.c.dataset,
            ampc_dataset_count(s.train), ampc_dataset_count(s.test), (long long)a.c.batch_size, ampc_optim_kind_name(ocfg.kind),
            ampc_graph_backend_name(s.g), cuda ? (a.c.tf32 ? " (tf32 on)" : " (tf32 off)") : "");
    fprintf(stderr, "ampc: amp %s\n", desc);
    fprintf(stderr, "ampc: ");
    cli_print_memory(stderr, &mem);
  }
  int tty = cli_is_tty() && !a.quiet;
  rc = 0;
  ampc_train_state ts = {.seed = a.c.seed};
  ampc_dataset_preprocessing(s.train, a.c.normalize, &ts.preprocessing); /* recorded in checkpoints */
  if (resume_path[0]) {
    if (ampc_checkpoint_load(resume_path, s.model, s.amp, s.opt, &ts) < 0) {
      cli_lib_error("--resume");
      rc = 1;
      goto done;
    }
    if (cli_check_resume(resume_path, &ts, ampc_loader_batches_per_epoch(ld)) < 0) {
      rc = 1;
      goto done;
    }
    if (ts.seed != a.c.seed) {
      cli_error("--resume: %s was made with --seed %llu, this run has --seed %llu", resume_path, (unsigned long long)ts.seed, (unsigned long long)a.c.seed);
      rc = 1;
      goto done;
    }
    if (!a.quiet) fprintf(stderr, "ampc: resumed from %s at epoch %lld, batch %lld, step %lld\n", resume_path, (long long)ts.epoch + 1, (long long)ts.batch, (long long)ts.step);
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  int64_t last_skip_report = -1, skip_repeats = 0;
  int accum = a.c.grad_accum;
  ampc_amp_set_loss_weight(s.amp, 1.0f / (float)accum);
  ampc_amp_set_grad_stats(s.amp, a.c.amp_report);
  int is_static = !s.amp_cfg.loss_scale_dynamic;
  for (int epoch = (int)ts.epoch; epoch < a.epochs && rc == 0; epoch++) {
    float lr = ampc_lr_at(&sched, ocfg.lr, epoch);
    int64_t start_batch = epoch == ts.epoch ? ts.batch : 0;
    if (epoch != ts.epoch) {
      ts.epoch = epoch;
      ts.batch = 0;
      ts.loss_sum = 0.0;
      ts.seen = ts.skipped = 0;
      ts.train_seconds = 0.0;
    }
    if (ampc_loader_start_epoch(ld, epoch, start_batch) < 0) {
      cli_lib_error(NULL);
      rc = 1;
      break;
    }
    int64_t nb = ampc_loader_batches_per_epoch(ld), b = start_batch;
    double t0 = cli_now(), last_print = t0, prior_seconds = ts.train_seconds;
    int64_t seen_here = 0;
    int micro = 0;
    ampc_amp_grad_stats st;
    ampc_amp_get_grad_stats(s.amp, &st, 1);
    for (;;) {
      int got = 0;
      if (ampc_loader_next(ld, in.x, in.y, &got) < 0) {
        cli_lib_error(NULL);
        rc = 1;
        break;
      }
      if (got == 0) break;
      b++;
      if (got < 2 && ampc_graph_max_batch(s.g) > 1) continue; /* batch norm needs two samples */
      float l = 0.0f;
      if (ampc_graph_set_batch(s.g, got) < 0 || ampc_graph_write(s.g, xv, in.x, lo.dtype) < 0 ||
          ampc_graph_write(s.g, yv, in.y, AMPC_DTYPE_I32) < 0 || ampc_amp_forward(s.amp, 1) < 0 ||
          ampc_amp_backward(s.amp, lossv, 0, micro > 0) < 0 || ampc_graph_read(s.g, lossv, &l, AMPC_DTYPE_F32) < 0) {
        cli_lib_error(NULL);
        rc = 1;
        break;
      }
      ts.loss_sum += (double)l * got;
      ts.seen += got;
      seen_here += got;
      if (++micro < accum && b < nb) continue;
      micro = 0;
      ampc_amp_step_info info;
      if (ampc_amp_step(s.amp, lr, &info) < 0) {
        cli_lib_error(NULL);
        rc = 1;
        break;
      }
      ts.step++;
      ts.batch = b;
      if (!info.applied) {
        ts.skipped++;
        ts.skipped_total++;
        if (is_static && !skip_nonfinite) {
          if (tty) fprintf(stderr, "\n");
          cli_error("step %lld: non-finite loss or gradients (loss %g; first non-finite gradient: %s); stopping (--on-nonfinite skip skips such steps)",
                    (long long)ts.step, l, info.nonfinite[0] ? info.nonfinite[0] : "?");
          rc = 1;
          break;
        }
        /* one line per skipped step at most; a run of skips is counted, not repeated */
        if (last_skip_report == ts.step - 1) {
          skip_repeats++;
        } else {
          if (skip_repeats) fprintf(stderr, "%sampc: (%lld more skipped steps in a row)\n", tty ? "\n" : "", (long long)skip_repeats);
          skip_repeats = 0;
          fprintf(stderr, "%sampc: step %lld: gradient overflow, step skipped, loss scale now %g; non-finite gradients in %d parameter%s: %s%s%s%s%s%s\n",
                  tty ? "\n" : "", (long long)ts.step, info.scale, info.n_nonfinite, info.n_nonfinite == 1 ? "" : "s",
                  info.nonfinite[0] ? info.nonfinite[0] : "?", info.n_nonfinite > 1 ? ", " : "", info.n_nonfinite > 1 ? info.nonfinite[1] : "",
                  info.n_nonfinite > 2 ? ", " : "", info.n_nonfinite > 2 ? info.nonfinite[2] : "", info.n_nonfinite > 3 ? ", ..." : "");
        }
        last_skip_report = ts.step;
        if (ampc_scaler_diverged(ampc_amp_scaler(s.amp, 0), 20) && !skip_nonfinite) {
          cli_error("step %lld: the loss scale stayed at its minimum (%g) for 20 overflowing steps in a row: training is diverging",
                    (long long)ts.step, info.scale);
          rc = 1;
          break;
        }
      }
      ts.train_seconds = prior_seconds + (cli_now() - t0);
      if (a.checkpoint_dir && a.save_every > 0 && ts.step % a.save_every == 0 && b < nb &&
          save_checkpoint(&s, a.checkpoint_dir, a.keep, &ts, a.quiet) < 0) {
        rc = 1;
        break;
      }
      if (stop_requested) break;
      double now = cli_now();
      if (!a.quiet && (tty ? now - last_print > 0.5 : (b % (nb / 4 > 0 ? nb / 4 : 1) == 0 && b < nb))) {
        double el = now - t0, ips = (double)seen_here / (el > 0 ? el : 1e-9);
        progress(tty, epoch + 1, b, nb, ts.loss_sum / (double)ts.seen, ips, (double)(nb - b) * el / (double)(b - start_batch));
        last_print = now;
      }
    }
    if (rc) break;
    if (stop_requested) {
      /* SIGINT/SIGTERM: save where we are and stop cleanly */
      const char *dir = a.checkpoint_dir ? a.checkpoint_dir : "checkpoints";
      if (tty) fprintf(stderr, "\n");
      fprintf(stderr, "ampc: %s received: saving a checkpoint at step %lld and stopping\n", stop_requested == SIGINT ? "SIGINT" : "SIGTERM", (long long)ts.step);
      /* the default folder is taken only now: take its lock like --checkpoint-dir's */
      if ((!a.checkpoint_dir && cli_ckptdir_lock("saving a checkpoint", dir) < 0) || save_checkpoint(&s, dir, a.keep, &ts, 0) < 0) rc = 1;
      break;
    }
    if (skip_repeats) {
      fprintf(stderr, "%sampc: (%lld more skipped steps in a row)\n", tty ? "\n" : "", (long long)skip_repeats);
      skip_repeats = 0;
      last_skip_report = -1;
    }
    double train_time = ts.train_seconds;
    double test_loss = NAN, test_acc = NAN;
    double te0 = cli_now();
    if (cli_evaluate(&s, s.test, &test_loss, &test_acc) < 0) {
      rc = 1;
      break;
    }
    double secs = train_time + (cli_now() - te0);
    double train_loss = ts.seen ? ts.loss_sum / (double)ts.seen : NAN;
    double ips = (double)ts.seen / (train_time > 0 ? train_time : 1e-9);
    if (tty) fprintf(stderr, "\r%*s\r", 100, "");
    printf("epoch %d: train_loss %.4f test_loss %.4f test_acc %.4f %.1f img/s %.1fs loss_scale %g skipped %lld\n",
           epoch + 1, train_loss, test_loss, test_acc, ips, secs, ampc_scaler_scale(ampc_amp_scaler(s.amp, 0)), (long long)ts.skipped);
    fflush(stdout);
    if (mf) {
      json_t *o = json_object();
      json_object_set_new(o, "epoch", json_integer(epoch + 1));
      json_object_set_new(o, "train_loss", json_real(train_loss));
      json_object_set_new(o, "test_loss", json_real(test_loss));
      json_object_set_new(o, "test_acc", json_real(test_acc));
      json_object_set_new(o, "images_per_s", json_real(ips));
      json_object_set_new(o, "seconds", json_real(secs));
      json_object_set_new(o, "train_seconds", json_real(train_time));
      json_object_set_new(o, "lr", json_real(lr));
      json_object_set_new(o, "steps", json_integer(ts.step));
      json_object_set_new(o, "opt_level", json_string(ampc_opt_level_name(s.amp_cfg.opt_level)));
      json_object_set_new(o, "half", json_string(ampc_dtype_name(s.amp_cfg.half_type)));
      if (strcmp(ampc_graph_backend_name(s.g), "cuda") == 0) json_object_set_new(o, "tf32", json_boolean(a.c.tf32));
      json_object_set_new(o, "loss_scale", json_real(ampc_scaler_scale(ampc_amp_scaler(s.amp, 0))));
      json_object_set_new(o, "skipped_steps", json_integer(ts.skipped));
      json_object_set_new(o, "skipped_steps_total", json_integer(ts.skipped_total));
      json_object_set_new(o, "memory", cli_memory_json(&mem));
      if (a.c.amp_report) {
        ampc_amp_get_grad_stats(s.amp, &st, 1);
        json_object_set_new(o, "grad_half_values", json_integer(st.values));
        json_object_set_new(o, "grad_underflow_fraction", json_real(st.values ? (double)st.underflow / (double)st.values : 0.0));
        json_object_set_new(o, "grad_max_abs", json_real(st.max_abs));
      }
      char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8));
      if (line) {
        fprintf(mf, "%s\n", line);
        fflush(mf);
        free(line);
      }
      json_decref(o);
    }
    if (a.checkpoint_dir) {
      ampc_train_state next = ts;
      next.epoch = epoch + 1;
      next.batch = 0;
      next.loss_sum = 0.0;
      next.seen = next.skipped = 0;
      next.train_seconds = 0.0;
      if (save_checkpoint(&s, a.checkpoint_dir, a.keep, &next, a.quiet) < 0) {
        rc = 1;
        break;
      }
    }
  }
  if (rc == 0 && a.save) {
    const char *meta[] = {"format", "ampc-weights-1", "model", ampc_model_name(s.model), NULL};
    if (cli_save_weights(&s, a.save, meta) < 0) rc = 1;
  }
done:
  ampc_loader_free(ld);
  cli_session_close(&s);
  free(in.x);
  free(in.y);
  if (mf && fclose(mf) != 0) {
    cli_error("--metrics: error writing '%s'", a.metrics);
    rc = 1;
  }
  return rc;
}
