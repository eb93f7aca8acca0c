/* The training step's passes on the cuda backend: the spans handed to one
 * kernel each (step.cu), the scratch they need (device memory kept from the
 * first step on), and the one read a step makes: the check's result, the
 * loss slots and the device's state in a single synchronisation. */
#include <string.h>

#include "ampc/rng.h"
#include "backend/cuda/cuda_internal.h"

enum { CU_SMALL_CHECK = 256, CU_SMALL_SLOTS = 512 }; /* offsets in the small pinned buffer */
#define CU_SMALL_BYTES (64u << 10)

static void cu_spans(const ampc__span *s, int ns, ampc__cu_spans *out) {
  AMPC_ASSERT(ns >= 0 && ns <= 3);
  memset(out, 0, sizeof *out);
  out->ns = ns;
  for (int i = 0; i < ns; i++)
    out->s[i] = (ampc__cu_span){s[i].start, s[i].n, (int)s[i].type, s[i].model, (int)s[i].grad_type, s[i].grad};
}

/* *p holds at least n bytes of device memory (grown, never shrunk). */
static ampc_status need(ampc__device *d, void **p, size_t *have, size_t n) {
  if (*p && *have >= n) return AMPC_OK;
  ampc__cu_free(d, *p);
  *p = ampc__cu_alloc(d, n);
  *have = *p ? n : 0;
  if (!*p) return ampc__error(AMPC_ENOMEM, "cuda: out of device memory for %zu bytes of the step's scratch", n);
  return AMPC_OK;
}

ampc_status ampc__cu_check_pass(ampc__device *d, const ampc__span *s, int ns, float gmul, int want_max, const float *slots,
                                int nslots, float *slots_out, ampc__check *out) {
  AMPC_TRY(ampc__cu_graph_flush(d));
  ampc__cuda_dev *cd = ampc__cu_of(d);
  ampc__cu_spans sp;
  cu_spans(s, ns, &sp);
  if ((size_t)nslots * sizeof(float) > CU_SMALL_BYTES - CU_SMALL_SLOTS)
    return ampc__error(AMPC_EINVAL, "cuda: %d loss slots are more than the check reads back", nslots);
  size_t nch = ampc__cu_check_chunks(&sp), have = cd->npartials * sizeof(ampc__cu_partial);
  AMPC_TRY(need(d, (void **)&cd->partials, &have, (nch ? nch : 1) * sizeof(ampc__cu_partial)));
  cd->npartials = have / sizeof(ampc__cu_partial);
  size_t one = sizeof(ampc__cu_check_result);
  if (!cd->check) AMPC_TRY(need(d, (void **)&cd->check, &one, one));
  cudaSetDevice(cd->dev);
  ampc__cu_timing *t = ampc__cu_step_timing_begin(d);
  int e = ampc__cu_check(cd->stream, &sp, gmul, want_max, cd->partials, cd->check);
  ampc__cu_step_timing_end(d, t);
  if (e) return ampc__cu_error_rt(e, "the step's check");
  unsigned char *small = cd->pin_small;
  AMPC_CU_TRY(cudaMemcpyAsync(small + CU_SMALL_CHECK, cd->check, sizeof(ampc__cu_check_result), cudaMemcpyDeviceToHost, cd->stream),
              "reading the check");
  if (nslots > 0)
    AMPC_CU_TRY(cudaMemcpyAsync(small + CU_SMALL_SLOTS, slots, (size_t)nslots * sizeof(float), cudaMemcpyDeviceToHost, cd->stream),
                "reading the loss slots");
  AMPC_TRY(ampc__cu_finish(d));
  ampc__cu_check_result r;
  memcpy(&r, small + CU_SMALL_CHECK, sizeof r);
  out->found_inf = r.found_inf;
  out->sumsq = r.sumsq;
  out->max_abs = r.max_abs;
  if (nslots > 0) memcpy(slots_out, small + CU_SMALL_SLOTS, (size_t)nslots * sizeof(float));
  return AMPC_OK;
}

ampc_status ampc__cu_fold_pass(ampc__device *d, const ampc__span *s, int ns, float *dst, float mul, int accumulate,
                               float *slot, float max_div) {
  AMPC_TRY(ampc__cu_graph_flush(d));
  ampc__cuda_dev *cd = ampc__cu_of(d);
  ampc__cu_spans sp;
  cu_spans(s, ns, &sp);
  size_t have = cd->fold_scratch ? 2 * sizeof(unsigned) : 0;
  AMPC_TRY(need(d, (void **)&cd->fold_scratch, &have, 2 * sizeof(unsigned)));
  cudaSetDevice(cd->dev);
  ampc__cu_timing *t = ampc__cu_step_timing_begin(d);
  int e = ampc__cu_fold(cd->stream, &sp, dst, mul, accumulate, slot, max_div, cd->fold_scratch);
  ampc__cu_step_timing_end(d, t);
  return e ? ampc__cu_error_rt(e, "folding gradients") : AMPC_OK;
}

ampc_status ampc__cu_nonfinite_pass(ampc__device *d, const ampc__span *s, int ns, const size_t *ranges, size_t nranges,
                                    float gmul, unsigned char *flags) {
  AMPC_TRY(ampc__cu_graph_flush(d));
  ampc__cuda_dev *cd = ampc__cu_of(d);
  if (!nranges) return AMPC_OK;
  ampc__cu_spans sp;
  cu_spans(s, ns, &sp);
  if (nranges > cd->cap_ranges) {
    size_t have_r = 0, have_f = 0;
    ampc__cu_free(d, cd->ranges);
    ampc__cu_free(d, cd->flags);
    cd->ranges = NULL;
    cd->flags = NULL;
    cd->cap_ranges = 0;
    AMPC_TRY(need(d, (void **)&cd->ranges, &have_r, 2 * nranges * sizeof(unsigned long long)));
    AMPC_TRY(need(d, (void **)&cd->flags, &have_f, nranges));
    cd->cap_ranges = nranges;
  }
  AMPC_ASSERT(sizeof(size_t) == sizeof(unsigned long long));
  AMPC_TRY(d->be->write(d, cd->ranges, AMPC_DTYPE_I64, ranges, AMPC_DTYPE_I64, 2 * nranges));
  cudaSetDevice(cd->dev);
  int e = ampc__cu_nonfinite(cd->stream, &sp, cd->ranges, nranges, gmul, cd->flags);
  if (e) return ampc__cu_error_rt(e, "finding non-finite gradients");
  return d->be->read(d, flags, AMPC_DTYPE_U8, cd->flags, AMPC_DTYPE_U8, nranges);
}

ampc_status ampc__cu_update_pass(ampc__device *d, const ampc__span *s, int ns, const ampc__update *u) {
  AMPC_TRY(ampc__cu_graph_flush(d));
  ampc__cuda_dev *cd = ampc__cu_of(d);
  ampc__cu_spans sp;
  cu_spans(s, ns, &sp);
  ampc__cu_update k;
  memset(&k, 0, sizeof k);
  k.kind = (int)u->kind;
  k.k = u->k;
  for (int i = 0; i < 3; i++) k.state[i] = u->state[i];
  k.master = u->master;
  k.gmul = u->gmul;
  k.sr = u->sr;
  k.sr_seed = u->sr_seed;
  k.sr_base = u->sr_base;
  k.sr_stream = AMPC_RNG_STREAM_ROUNDING;
  cudaSetDevice(cd->dev);
  ampc__cu_timing *t = ampc__cu_step_timing_begin(d);
  int e = ampc__cu_update_run(cd->stream, &sp, &k);
  ampc__cu_step_timing_end(d, t);
  return e ? ampc__cu_error_rt(e, "the optimizer update") : AMPC_OK;
}
