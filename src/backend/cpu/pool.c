/* Pooling: max and average pools one (n, c) plane at a time, the 2x2
 * stride-2 max pool's vector paths (which the batch norm's fused pool uses
 * too), and the global average pool. */
#include <math.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"

/* ---- pooling: one (n, c) plane at a time ---- */

size_t ampc__cpu_pool_ws(const ampc__op_call *c, int nthreads) {
  const ampc_shape *x = &c->in[0].shape, *y = &c->out.shape;
  size_t in = (size_t)(x->d[2] * x->d[3]), out = (size_t)(y->ndim == 4 ? y->d[2] * y->d[3] : 1);
  return ((size_t)nthreads * (3 * in + 2 * out + 16) + 64) * sizeof(float);
}

ampc_status ampc__cpu_pool_fwd(const ampc__op_call *c) {
  const ampc_shape *xs = &c->in[0].shape, *ys = &c->out.shape;
  int64_t planes = xs->d[0] * xs->d[1], H = xs->d[2], W = xs->d[3], OH = ys->d[2], OW = ys->d[3];
  int k = c->attr.k, s = c->attr.stride, p = c->attr.pad, is_max = c->op == AMPC_OP_MAXPOOL2D;
  size_t per = (size_t)(3 * H * W + 2 * OH * OW + 16);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (planes * H * W > 32768)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *buf = cpu_ws_slice(c, omp_get_thread_num(), per, 64), *out = buf + H * W;
    unsigned char *win = (unsigned char *)(out + OH * OW);
    const float *x = cpu_load(&c->in[0], pl * H * W, (size_t)(H * W), buf);
    if (is_max && k == 2 && s == 2 && p == 0) {
      /* the common case, without the window bookkeeping */
      ampc__cpu_pool2_select(x, H, W, out, win);
      cpu_store(&c->out, pl * OH * OW, out, (size_t)(OH * OW), 0, NULL);
      continue;
    }
    for (int64_t oy = 0; oy < OH; oy++)
      for (int64_t ox = 0; ox < OW; ox++) {
        float acc = is_max ? -INFINITY : 0.0f;
        for (int ky = 0; ky < k; ky++) {
          int64_t iy = oy * s - p + ky;
          if (iy < 0 || iy >= H) continue;
          for (int kx = 0; kx < k; kx++) {
            int64_t ix = ox * s - p + kx;
            if (ix < 0 || ix >= W) continue;
            float v = x[iy * W + ix];
            if (is_max) {
              if (v > acc || isnan(v)) acc = v;
            } else {
              acc += v;
            }
          }
        }
        out[oy * OW + ox] = is_max ? acc : acc / (float)(k * k);
      }
    cpu_store(&c->out, pl * OH * OW, out, (size_t)(OH * OW), 0, NULL);
  }
  return AMPC_OK;
}

/* 2x2 max pooling, stride 2, of one f32 plane: each window's first maximum
 * (a NaN beats any number) and its place, 0..3 in reading order. Eight
 * windows per step, without branches: along a row when rows hold a step (the
 * last step of a row overlapping the one before), else over the plane's
 * windows in reading order, gathered. Every 2x2
 * max-pool path (plain and fused into batch norm) picks its winners here. */
typedef unsigned char cpu_v8u8 __attribute__((vector_size(8)));

/* the winners of 8 windows whose four elements (reading order) are e[0..3] */
static inline void pool2_pick(const cpu_v8 e[4], float *out, unsigned char *win) {
  cpu_v8 a = e[0], b = e[1], c = e[2], d = e[3], bv = a;
  cpu_v8i w = {0}, one = w + 1, t;
  t = (b > bv) | ((b != b) & (bv == bv));
  bv = CPU_SEL8(t, b, bv);
  w = (t & one) | (w & ~t);
  t = (c > bv) | ((c != c) & (bv == bv));
  bv = CPU_SEL8(t, c, bv);
  w = (t & (one + one)) | (w & ~t);
  t = (d > bv) | ((d != d) & (bv == bv));
  bv = CPU_SEL8(t, d, bv);
  w = (t & (one + one + one)) | (w & ~t);
  CPU_ST8(out, bv);
  cpu_v8u8 w8 = __builtin_convertvector(w, cpu_v8u8);
  memcpy(win, &w8, 8);
}

/* where the gradients of 8 windows go: g masked to each of the 4 places */
static inline void pool2_spread(const float *dy, const unsigned char *win, cpu_v8 *ga, cpu_v8 *gb, cpu_v8 *gc, cpu_v8 *gd) {
  cpu_v8u8 w8;
  memcpy(&w8, win, 8);
  cpu_v8i w = __builtin_convertvector(w8, cpu_v8i), z = {0};
  cpu_v8i g = (cpu_v8i)CPU_LD8(dy);
  *ga = (cpu_v8)(g & (w == z));
  *gb = (cpu_v8)(g & (w == z + 1));
  *gc = (cpu_v8)(g & (w == z + 2));
  *gd = (cpu_v8)(g & (w == z + 3));
}

/* 8 windows of one row pair r0/r1: even and odd columns of both rows */
static inline void pool2_select8(const float *r0, const float *r1, float *out, unsigned char *win) {
  cpu_v8 p = CPU_LD8(r0), q = CPU_LD8(r0 + 8), u = CPU_LD8(r1), v = CPU_LD8(r1 + 8);
  cpu_v8 e[4] = {__builtin_shufflevector(p, q, 0, 2, 4, 6, 8, 10, 12, 14), __builtin_shufflevector(p, q, 1, 3, 5, 7, 9, 11, 13, 15),
                 __builtin_shufflevector(u, v, 0, 2, 4, 6, 8, 10, 12, 14), __builtin_shufflevector(u, v, 1, 3, 5, 7, 9, 11, 13, 15)};
  pool2_pick(e, out, win);
}

static inline void pool2_scatter8(const float *dy, const unsigned char *win, float *d0, float *d1) {
  cpu_v8 ga, gb, gc, gd;
  pool2_spread(dy, win, &ga, &gb, &gc, &gd);
  CPU_ST8(d0, __builtin_shufflevector(ga, gb, 0, 8, 1, 9, 2, 10, 3, 11));
  CPU_ST8(d0 + 8, __builtin_shufflevector(ga, gb, 4, 12, 5, 13, 6, 14, 7, 15));
  CPU_ST8(d1, __builtin_shufflevector(gc, gd, 0, 8, 1, 9, 2, 10, 3, 11));
  CPU_ST8(d1 + 8, __builtin_shufflevector(gc, gd, 4, 12, 5, 13, 6, 14, 7, 15));
}

/* The first element of windows j .. j+7 in reading order (oy, ox: window j's
 * place, advanced past them); windows past the plane repeat the last one. */
static inline void pool2_corners(int64_t W, int64_t OW, int64_t nwin, int64_t j, int64_t *oy, int64_t *ox, int idx[8]) {
  for (int l = 0; l < 8; l++) {
    idx[l] = (int)(2 * *oy * W + 2 * *ox);
    if (j + l + 1 < nwin && ++*ox == OW) {
      *ox = 0;
      ++*oy;
    }
  }
}

CPU_VECTOR static void pool2_select_plane(const float *x, int64_t H, int64_t W, float *out, unsigned char *win) {
  int64_t OH = H / 2, OW = W / 2;
  if (OW >= 8) {
    /* a row's last step overlaps the one before when 8 does not divide OW:
     * the windows they share are picked twice, the same way */
    for (int64_t oy = 0; oy < OH; oy++) {
      const float *r0 = x + 2 * oy * W, *r1 = r0 + W;
      float *o = out + oy * OW;
      unsigned char *w = win + oy * OW;
      for (int64_t s = 0; s < OW; s += 8) {
        int64_t ox = s + 8 <= OW ? s : OW - 8;
        pool2_select8(r0 + 2 * ox, r1 + 2 * ox, o + ox, w + ox);
      }
    }
    return;
  }
  if (OW >= 4) {
    /* short rows: a step per row pair, its loads running into the next row
     * pair and its stores past the row, where the next row pair's rewrite
     * them; the last row pair through a staged copy, inside the plane */
    for (int64_t oy = 0; oy + 1 < OH; oy++) pool2_select8(x + 2 * oy * W, x + (2 * oy + 1) * W, out + oy * OW, win + oy * OW);
    float a[16] = {0}, b[16] = {0}, ob[8];
    unsigned char wb[8];
    memcpy(a, x + 2 * (OH - 1) * W, (size_t)(2 * OW) * sizeof(float));
    memcpy(b, x + (2 * OH - 1) * W, (size_t)(2 * OW) * sizeof(float));
    pool2_select8(a, b, ob, wb);
    memcpy(out + (OH - 1) * OW, ob, (size_t)OW * sizeof(float));
    memcpy(win + (OH - 1) * OW, wb, (size_t)OW);
    return;
  }
  /* rows of 1 to 3 windows: the windows in reading order, 8 at a time */
  int64_t nwin = OH * OW, oy = 0, ox = 0;
  for (int64_t j = 0; j < nwin; j += 8) {
    int idx[8];
    pool2_corners(W, OW, nwin, j, &oy, &ox, idx);
    float g[4][8];
    for (int l = 0; l < 8; l++) {
      const float *p = x + idx[l];
      g[0][l] = p[0];
      g[1][l] = p[1];
      g[2][l] = p[W];
      g[3][l] = p[W + 1];
    }
    cpu_v8 e[4] = {CPU_LD8(g[0]), CPU_LD8(g[1]), CPU_LD8(g[2]), CPU_LD8(g[3])};
    float ob[8];
    unsigned char wb[8];
    pool2_pick(e, ob, wb);
    size_t n = (size_t)(nwin - j < 8 ? nwin - j : 8);
    memcpy(out + j, ob, n * sizeof(float));
    memcpy(win + j, wb, n);
  }
}

/* rows of 1 to 3 windows: the windows in reading order, 8 at a time */
static inline void pool2_scatter_gathered(const float *dy, const unsigned char *win, int64_t W, int64_t OH, int64_t OW, float *dx) {
  int64_t nwin = OH * OW, oy = 0, ox = 0;
  for (int64_t j = 0; j < nwin; j += 8) {
    int idx[8];
    pool2_corners(W, OW, nwin, j, &oy, &ox, idx);
    size_t n = (size_t)(nwin - j < 8 ? nwin - j : 8);
    float gb[8] = {0};
    unsigned char wb[8] = {0};
    memcpy(gb, dy + j, n * sizeof(float));
    memcpy(wb, win + j, n);
    cpu_v8 ga, gbv, gc, gd;
    pool2_spread(gb, wb, &ga, &gbv, &gc, &gd);
    for (size_t l = 0; l < n; l++) {
      float *p = dx + idx[l];
      p[0] = ga[l];
      p[1] = gbv[l];
      p[W] = gc[l];
      p[W + 1] = gd[l];
    }
  }
}

CPU_VECTOR static void pool2_scatter_plane(const float *dy, const unsigned char *win, int64_t H, int64_t W, float *dx) {
  int64_t OH = H / 2, OW = W / 2;
  if (OW >= 8) {
    for (int64_t oy = 0; oy < OH; oy++) {
      float *d0 = dx + 2 * oy * W, *d1 = d0 + W;
      const float *g = dy + oy * OW;
      const unsigned char *w = win + oy * OW;
      for (int64_t s = 0; s < OW; s += 8) {
        int64_t ox = s + 8 <= OW ? s : OW - 8;
        pool2_scatter8(g + ox, w + ox, d0 + 2 * ox, d1 + 2 * ox);
      }
    }
  } else if (OW >= 4) {
    /* as in the selection: each row pair's stores run into the next, which
     * rewrites them (the odd last column is zeroed below) */
    for (int64_t oy = 0; oy + 1 < OH; oy++) pool2_scatter8(dy + oy * OW, win + oy * OW, dx + 2 * oy * W, dx + (2 * oy + 1) * W);
    float g[8] = {0}, d0[16], d1[16];
    unsigned char w[8] = {0};
    memcpy(g, dy + (OH - 1) * OW, (size_t)OW * sizeof(float));
    memcpy(w, win + (OH - 1) * OW, (size_t)OW);
    pool2_scatter8(g, w, d0, d1);
    memcpy(dx + 2 * (OH - 1) * W, d0, (size_t)(2 * OW) * sizeof(float));
    memcpy(dx + (2 * OH - 1) * W, d1, (size_t)(2 * OW) * sizeof(float));
  } else {
    pool2_scatter_gathered(dy, win, W, OH, OW, dx);
  }
  if (W & 1) /* a last odd column is outside every window */
    for (int64_t y = 0; y < 2 * OH; y++) dx[y * W + W - 1] = 0.0f;
  if (H & 1) memset(dx + (H - 1) * W, 0, (size_t)W * sizeof(float));
}


/* The entry points batch norm's fused pool calls (a multiversioned
 * function stays static in its file). */
void ampc__cpu_pool2_select(const float *x, int64_t H, int64_t W, float *out, unsigned char *win) {
  pool2_select_plane(x, H, W, out, win);
}
void ampc__cpu_pool2_scatter(const float *dy, const unsigned char *win, int64_t H, int64_t W, float *dx) {
  pool2_scatter_plane(dy, win, H, W, dx);
}

/* Max pooling's gradient goes to the first maximum of each window (as
 * PyTorch's), found again from the input rather than stored. */
ampc_status ampc__cpu_pool_bwd(const ampc__op_call *c) {
  if (!c->din[0].data) return AMPC_OK;
  const ampc_shape *xs = &c->in[0].shape, *ys = &c->out.shape;
  int64_t planes = xs->d[0] * xs->d[1], H = xs->d[2], W = xs->d[3], OH = ys->d[2], OW = ys->d[3];
  int k = c->attr.k, s = c->attr.stride, p = c->attr.pad, is_max = c->op == AMPC_OP_MAXPOOL2D;
  size_t per = (size_t)(3 * H * W + 2 * OH * OW + 16);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (planes * H * W > 32768)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *xb = cpu_ws_slice(c, omp_get_thread_num(), per, 64), *dx = xb + H * W, *tmp = dx + H * W;
    float *dyb = tmp + H * W;
    unsigned char *win = (unsigned char *)(dyb + OH * OW);
    const float *x = is_max ? cpu_load(&c->in[0], pl * H * W, (size_t)(H * W), xb) : NULL;
    const float *dy = cpu_load(&c->dout, pl * OH * OW, (size_t)(OH * OW), dyb);
    if (is_max && k == 2 && s == 2 && p == 0) {
      /* every element of dx written: the windows' winners get dy, the rest zero */
      ampc__cpu_pool2_select(x, H, W, tmp, win);
      ampc__cpu_pool2_scatter(dy, win, H, W, dx);
      cpu_store_grad(c, &c->din[0], pl * H * W, dx, (size_t)(H * W), c->din_acc[0], tmp);
      continue;
    }
    memset(dx, 0, (size_t)(H * W) * sizeof(float));
    for (int64_t oy = 0; oy < OH; oy++)
      for (int64_t ox = 0; ox < OW; ox++) {
        float g = dy[oy * OW + ox];
        if (is_max) {
          int64_t best = -1;
          float bv = -INFINITY;
          for (int ky = 0; ky < k; ky++) {
            int64_t iy = oy * s - p + ky;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < k; kx++) {
              int64_t ix = ox * s - p + kx;
              if (ix < 0 || ix >= W) continue;
              float v = x[iy * W + ix];
              if (best < 0 || v > bv || (isnan(v) && !isnan(bv))) {
                bv = v;
                best = iy * W + ix;
              }
            }
          }
          if (best >= 0) dx[best] += g;
        } else {
          float share = g / (float)(k * k);
          for (int ky = 0; ky < k; ky++) {
            int64_t iy = oy * s - p + ky;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < k; kx++) {
              int64_t ix = ox * s - p + kx;
              if (ix >= 0 && ix < W) dx[iy * W + ix] += share;
            }
          }
        }
      }
    cpu_store_grad(c, &c->din[0], pl * H * W, dx, (size_t)(H * W), c->din_acc[0], tmp);
  }
  return AMPC_OK;
}

ampc_status ampc__cpu_gap_fwd(const ampc__op_call *c) {
  const ampc_shape *xs = &c->in[0].shape;
  int64_t planes = xs->d[0] * xs->d[1], HW = xs->d[2] * xs->d[3];
  size_t per = (size_t)(3 * HW + 2 + 16);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (planes * HW > 32768)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *buf = cpu_ws_slice(c, omp_get_thread_num(), per, 64);
    const float *x = cpu_load(&c->in[0], pl * HW, (size_t)HW, buf);
    float acc = 0.0f;
    for (int64_t i = 0; i < HW; i++) acc += x[i];
    float m = acc / (float)HW;
    cpu_store(&c->out, pl, &m, 1, 0, NULL);
  }
  return AMPC_OK;
}

ampc_status ampc__cpu_gap_bwd(const ampc__op_call *c) {
  if (!c->din[0].data) return AMPC_OK;
  const ampc_shape *xs = &c->in[0].shape;
  int64_t planes = xs->d[0] * xs->d[1], HW = xs->d[2] * xs->d[3];
  size_t per = (size_t)(3 * HW + 2 + 16);
#pragma omp parallel for num_threads(cpu_ctx(c)->nthreads) schedule(static) if (planes * HW > 32768)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *buf = cpu_ws_slice(c, omp_get_thread_num(), per, 64), *tmp = buf + HW;
    float g;
    ampc_load_f32(&g, c->dout.dtype, cpu_at(&c->dout, pl), 1);
    g /= (float)HW;
    for (int64_t i = 0; i < HW; i++) buf[i] = g;
    cpu_store_grad(c, &c->din[0], pl * HW, buf, (size_t)HW, c->din_acc[0], tmp);
  }
  return AMPC_OK;
}
