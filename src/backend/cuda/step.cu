/* The training step's flat passes over the parameter spans (at most three:
 * one per storage type), each one launch over all of them: the check
 * (unscale, finiteness, sum of squares, largest magnitude) in chunks whose
 * partial results one block then adds in chunk order -- the same result
 * every run; folding into f32; which parameters hold non-finite gradients;
 * the optimizer update, with step_math.h's element functions.
 *
 * This file is compiled without contraction (nvcc -fmad=false): step_math.h
 * writes each of torch's roundings as its own operation, and the cpu
 * backend's update gives the same bits. */
#include <float.h>

#include "ampc/optim.h"
#include "ampc/rng.h"
#include "backend/cuda/cuda_common.cuh"

using namespace ampc_cu;

/* Element e of the spans' concatenation: its span and the offset in it. */
AMPC__D const ampc__cu_span *span_of(const ampc__cu_spans &sp, int64_t e, int64_t *off) {
  int k = 0;
  while (k + 1 < sp.ns && e >= (int64_t)sp.s[k].n) {
    e -= (int64_t)sp.s[k].n;
    k++;
  }
  *off = e;
  return &sp.s[k];
}

AMPC__HD int64_t spans_total_d(const ampc__cu_spans &sp) {
  int64_t n = 0;
  for (int i = 0; i < sp.ns; i++) n += (int64_t)sp.s[i].n;
  return n;
}
static size_t spans_total(const ampc__cu_spans *sp) { return (size_t)spans_total_d(*sp); }

extern "C" size_t ampc__cu_check_chunks(const ampc__cu_spans *sp) {
  size_t c = 0;
  for (int i = 0; i < sp->ns; i++) c += (sp->s[i].n + AMPC__CU_STEP_CHUNK - 1) / AMPC__CU_STEP_CHUNK;
  return c;
}

/* Chunk k of the spans (chunks do not cross spans). */
AMPC__D const ampc__cu_span *chunk_of(const ampc__cu_spans &sp, int64_t k, int64_t *off, int64_t *len) {
  const int64_t chunk = AMPC__CU_STEP_CHUNK;
  for (int i = 0; i < sp.ns; i++) {
    int64_t c = ((int64_t)sp.s[i].n + chunk - 1) / chunk;
    if (k < c) {
      *off = k * chunk;
      *len = (int64_t)sp.s[i].n - *off < chunk ? (int64_t)sp.s[i].n - *off : chunk;
      return &sp.s[i];
    }
    k -= c;
  }
  *off = *len = 0;
  return &sp.s[0];
}

/* one block per chunk */
__global__ void k_check_chunks(ampc__cu_spans sp, float gmul, ampc__cu_partial *partials) {
  __shared__ double shd[THREADS];
  __shared__ float shf[THREADS];
  __shared__ int shi[THREADS];
  int64_t off, len;
  const ampc__cu_span *s = chunk_of(sp, blockIdx.x, &off, &len);
  double sq = 0.0;
  float mx = 0.0f;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    float v = ld(s->grad, s->grad_type, off + i) * gmul, m = fabsf(v);
    bad |= !(m <= FLT_MAX);
    sq += (double)v * v;
    mx = m > mx ? m : mx; /* a NaN never wins */
  }
  sq = block_sum<double>(sq, shd);
  mx = block_max(mx, shf);
  bad = block_sum<int>(bad, shi);
  if (threadIdx.x == 0) {
    partials[blockIdx.x].sumsq = sq;
    partials[blockIdx.x].max_abs = mx;
    partials[blockIdx.x].bad = bad != 0;
  }
}

/* the chunks' partials added in chunk order by each thread's share, then the tree: one block */
__global__ void k_check_final(const ampc__cu_partial *partials, int64_t n, int want_max, ampc__cu_check_result *out) {
  __shared__ double shd[THREADS];
  __shared__ float shf[THREADS];
  __shared__ int shi[THREADS];
  double sq = 0.0;
  float mx = 0.0f;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sq += partials[i].sumsq;
    mx = partials[i].max_abs > mx ? partials[i].max_abs : mx;
    bad |= partials[i].bad;
  }
  sq = block_sum<double>(sq, shd);
  mx = block_max(mx, shf);
  bad = block_sum<int>(bad, shi);
  if (threadIdx.x == 0) {
    out->sumsq = sq;
    out->max_abs = want_max ? mx : 0.0f;
    out->found_inf = bad != 0;
  }
}

extern "C" int ampc__cu_check(ampc__cu_stream s, const ampc__cu_spans *sp, float gmul, int want_max,
                              ampc__cu_partial *partials, ampc__cu_check_result *out) {
  size_t nch = ampc__cu_check_chunks(sp);
  if (nch) AMPC_LAUNCH(k_check_chunks, (unsigned)nch, THREADS, 0, s, *sp, gmul, partials);
  AMPC_LAUNCH(k_check_final, 1u, THREADS, 0, s, partials, (int64_t)nch, want_max, out);
  return launch_status();
}

/* scratch[0]: some value is not finite; scratch[1]: the bits of the largest
 * |value| (non-negative floats order as their bits, an infinity above all) */
__global__ void k_fold(ampc__cu_spans sp, float *dst, float mul, int accumulate, unsigned *scratch) {
  __shared__ float shf[THREADS];
  __shared__ int shi[THREADS];
  float mx = 0.0f;
  int bad = 0;
  AMPC_GRID_STRIDE(e, spans_total_d(sp)) {
    int64_t off;
    const ampc__cu_span *s = span_of(sp, e, &off);
    float v = ld(s->grad, s->grad_type, off), m = fabsf(v);
    bad |= !is_finite(v);
    mx = m > mx ? m : mx;
    float *o = dst + s->start + off, prod = x86_nan(v * mul, v, mul);
    /* (a NaN folded keeps the cpu's bits: the same state on both devices) */
    *o = accumulate ? x86_nan(*o + prod, *o, prod) : prod;
  }
  mx = block_max(mx, shf);
  bad = block_sum<int>(bad, shi);
  if (threadIdx.x == 0) {
    if (bad) atomicOr(&scratch[0], 1u);
    atomicMax(&scratch[1], ampc__f32_bits(mx));
  }
}

/* slot[0] = 1 on a non-finite value; slot[1] = max(slot[1], max / max_div)
 * when the largest magnitude is finite (as the cpu's fold) */
__global__ void k_fold_final(const unsigned *scratch, float *slot, float max_div) {
  if (threadIdx.x != 0) return;
  if (scratch[0]) slot[0] = 1.0f;
  float mx = ampc__bits_f32(scratch[1]);
  if (is_finite(mx) && mx / max_div > slot[1]) slot[1] = mx / max_div;
}

extern "C" int ampc__cu_fold(ampc__cu_stream s, const ampc__cu_spans *sp, float *dst, float mul, int accumulate,
                             float *slot, float max_div, unsigned *scratch) {
  cudaError_t e = cudaMemsetAsync(scratch, 0, 2 * sizeof(unsigned), s);
  if (e != cudaSuccess) return (int)e;
  size_t n = spans_total(sp);
  if (n) AMPC_LAUNCH(k_fold, grid_for(n), THREADS, 0, s, *sp, dst, mul, accumulate, scratch);
  AMPC_LAUNCH(k_fold_final, 1u, 32u, 0, s, scratch, slot, max_div);
  return launch_status();
}

/* one block per range: the span holding it, its elements in turn */
__global__ void k_nonfinite(ampc__cu_spans sp, const unsigned long long *ranges, float gmul, unsigned char *flags) {
  __shared__ int shi[THREADS];
  int64_t r = blockIdx.x;
  size_t start = (size_t)ranges[2 * r], n = (size_t)ranges[2 * r + 1];
  int bad = 0;
  for (int i = 0; i < sp.ns; i++) {
    const ampc__cu_span *s = &sp.s[i];
    if (start < s->start || start + n > s->start + s->n) continue;
    for (int64_t e = threadIdx.x; e < (int64_t)n; e += blockDim.x)
      bad |= !(fabsf(ld(s->grad, s->grad_type, (int64_t)(start - s->start) + e) * gmul) <= FLT_MAX);
    break;
  }
  bad = block_sum<int>(bad, shi);
  if (threadIdx.x == 0) flags[r] = bad != 0;
}

extern "C" int ampc__cu_nonfinite(ampc__cu_stream s, const ampc__cu_spans *sp, const unsigned long long *ranges,
                                  size_t nranges, float gmul, unsigned char *flags) {
  if (!nranges) return 0;
  AMPC_LAUNCH(k_nonfinite, (unsigned)nranges, THREADS, 0, s, *sp, ranges, gmul, flags);
  return launch_status();
}

/* The optimizer on one f32 weight w of flat number `flat` (g: the gradient
 * times gmul), the cpu's update_f32 for one element. */
AMPC__D float optim_one(const ampc__cu_update &u, size_t flat, float w, float g) {
  ampc__optim_consts k = u.k;
  if (u.kind == AMPC_OPTIM_SGD) return ampc__sgd_one(&k, w, g, u.state[0] ? u.state[0] + flat : NULL);
  return ampc__adam_one(&k, w, g, u.state[0] + flat, u.state[1] + flat, u.state[2] ? u.state[2] + flat : NULL);
}

__global__ void k_update(ampc__cu_spans sp, ampc__cu_update u) {
  AMPC_GRID_STRIDE(e, spans_total_d(sp)) {
    int64_t off;
    const ampc__cu_span *s = span_of(sp, e, &off);
    size_t flat = s->start + (size_t)off;
    float g = ld(s->grad, s->grad_type, off) * u.gmul;
    if (u.master) {
      float w = optim_one(u, flat, u.master[flat], g);
      u.master[flat] = w;
      if (s->model) st(s->model, s->type, off, w);
    } else if (s->type == F32) {
      float *m = (float *)s->model + off;
      *m = optim_one(u, flat, *m, g);
    } else {
      float w = optim_one(u, flat, ld(s->model, s->type, off), g);
      if (u.sr)
        ((uint16_t *)s->model)[off] =
            ampc__round_stochastic(s->type == F16, w, ampc__rng_at(u.sr_seed, u.sr_stream, u.sr_base + flat));
      else
        st(s->model, s->type, off, w);
    }
  }
}

extern "C" int ampc__cu_update_run(ampc__cu_stream s, const ampc__cu_spans *sp, const ampc__cu_update *u) {
  size_t n = spans_total(sp);
  if (!n) return 0;
  AMPC_LAUNCH(k_update, grid_for(n, 65536), THREADS, 0, s, *sp, *u);
  return launch_status();
}
