/*
 * backend.h -- where a graph runs: a device, chosen by name before compile.
 *
 * A backend is a device that owns the graph's memory -- parameters,
 * gradients, activations, workspace, and the amp layer's master weights and
 * optimizer state -- and runs every kernel of the training step on it. Code
 * outside the backend never touches that memory through a pointer: values go
 * in and out through ampc_graph_write() / ampc_graph_read() (and the amp and
 * optimizer calls of the same kind), which convert between types.
 *
 *     ampc_backend_opts o;
 *     ampc_backend_opts_default(&o);
 *     o.threads = 2;
 *     if (ampc_graph_set_backend(g, "cpu", &o) < 0) ...ampc_last_error()...
 *
 * Backends built into this library are listed by ampc_backend_names():
 *
 *   cpu          the reference backend: OpenMP kernels and OpenBLAS, host memory
 *   cpu-guarded  the cpu kernels, but the device memory is mapped with no
 *                access whenever control is outside a backend call, so any
 *                access that bypasses the interface faults at once (tests)
 *   cuda         NVIDIA GPUs (only where ampc was built with CUDA): cuBLAS for
 *                linear layers, cuDNN for convolutions, ampc's own kernels
 *                for the rest and for the training step; device memory
 *
 * Without a call, a graph runs on "cpu" with the default options.
 */
#ifndef AMPC_BACKEND_PUBLIC_H
#define AMPC_BACKEND_PUBLIC_H

#include <stdint.h>

#include "ampc/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the cpu backends compute convolutions. AUTO (the default) uses
 * Winograd for stride-1 3x3 kernels where it is faster (8 or more input and
 * output channels: F(4x4, 3x3) with 16-bit storage, or F(6x6, 3x3) where
 * F(4x4)'s tiles overhang the planes and it does clearly less work; where
 * input, weight and output are all f32, F(2x2, 3x3), about as accurate as a
 * direct sum, except for the weight gradient, F(4x4, 3x3)), a direct loop for stride-1
 * 3x3 kernels over inputs of at most 4 channels (a first layer), and im2col
 * matrix products elsewhere; IM2COL forces the plain path (the reference the
 * others are tested against); WINOGRAD and DIRECT use theirs wherever it
 * applies (stride 1, 3x3, padding 0..2; the direct loop computes forward and
 * the weight gradient, the input gradient stays with im2col). */
typedef enum { AMPC_CONV_AUTO = 0, AMPC_CONV_IM2COL = 1, AMPC_CONV_WINOGRAD = 2, AMPC_CONV_DIRECT = 3 } ampc_conv_algo;

/* Options of a backend; each backend reads the ones it has. */
typedef struct {
  int threads;          /* cpu: kernel threads; 0 = OpenMP's default */
  ampc_conv_algo conv;  /* cpu: convolution algorithm */
  int profiling;        /* time every kernel per op kind (ampc_graph_backend_stats) */
  int tf32;             /* cuda: f32 matrix products and convolutions may use TF32 tensor
                         * cores (inputs rounded to 10 mantissa bits); 0 (default): true
                         * f32 arithmetic (torch.backends.cuda.matmul.allow_tf32 = False) */
  int device;           /* cuda: which GPU (0 = the first CUDA_VISIBLE_DEVICES shows) */
  int no_cuda_graphs;   /* cuda: launch every kernel as it comes; 0 (default): a sequence of
                         * ops that repeats (a training step's forward and backward) is
                         * captured once as a CUDA graph and replayed (not while profiling) */
  int cudnn_any_algo;   /* cuda: convolution algorithms chosen by time alone, non-deterministic
                         * ones too (torch.backends.cudnn.deterministic = False); 0 (default):
                         * deterministic ones where one fits, so a run repeats bit for bit */
} ampc_backend_opts;

void ampc_backend_opts_default(ampc_backend_opts *o); /* (NULL: nothing) */
/* The backends built into this library, comma separated: "cpu, cpu-guarded". */
const char *ampc_backend_names(void);
/* 0 if name is a backend this library can run here (NULL: "cpu", the
 * default); otherwise an error saying why ("ampc was built without CUDA",
 * "unknown backend 'x'"). */
ampc_status ampc_backend_check(const char *name);

/* Runs g on the named backend (NULL: "cpu") with the given options (NULL:
 * defaults).
 * Before compile. */
ampc_status ampc_graph_set_backend(ampc_graph *g, const char *name, const ampc_backend_opts *o);
/* The backend's name ("cpu" until one is set). */
const char *ampc_graph_backend_name(const ampc_graph *g);
/* The kernel threads of g's backend (cpu: as resolved; 1 elsewhere). */
int ampc_graph_threads(const ampc_graph *g);

/* What a backend measured since the last reset. */
typedef struct {
  double fwd[AMPC_OP_COUNT], bwd[AMPC_OP_COUNT]; /* seconds per op kind (with profiling) */
  double conv_bwd_data, conv_bwd_weights;        /* convolution backward split in its two products */
  int64_t grad_values;    /* gradient values (non-zero in f32) stored into 16-bit tensors ... */
  int64_t grad_underflow; /* ... and of those the ones that became zero or subnormal (amp's grad stats) */
  int64_t reads;          /* device-to-host reads (a training step makes one) */
  int64_t mem_reserved;   /* cuda: bytes taken from the device (its caching arena), now ... */
  int64_t mem_reserved_peak; /* ... and at the peak; 0 where the backend does not track them (cpu) */
  int64_t mem_in_use_peak;  /* cuda: the most bytes handed out at once (the arena's blocks in use) */
  double step;              /* seconds of the step's passes on the device (check, fold, update), where
                             * the backend times them (cuda, with profiling: the host's clock says
                             * little there, the device running behind it); 0 elsewhere */
} ampc_backend_stats;
/* (a NULL g gives zeros; a NULL s, nothing) */
void ampc_graph_backend_stats(const ampc_graph *g, ampc_backend_stats *s, int reset);
/* Turns kernel timing on or off (at any time; clears the times). */
void ampc_graph_set_profiling(ampc_graph *g, int on);
/* What the backend chose for g, as text (lines ending in '\n'; cuda: each
 * convolution shape's cuDNN algorithms with their measured times and
 * workspace, and the fastest candidate where it was not taken), into buf
 * (at most n bytes with the terminating 0; cut at a line end). Returns the
 * length written: 0 where the backend has nothing to say (cpu). */
size_t ampc_graph_backend_notes(const ampc_graph *g, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
