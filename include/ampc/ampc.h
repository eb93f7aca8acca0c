/*
 * ampc.h -- the whole public API of libampc.
 *
 *   status.h       error codes and messages
 *   dtype.h        f32 / f16 / bf16 storage and conversions
 *   rng.h          the seeded counter-based generator
 *   tensor.h       typed views of memory
 *   graph.h        recording, compiling and running a model; autodiff
 *   nn.h           layers and the built-in models (PyTorch names and init)
 *   optim.h        SGD, Adam, AdamW and learning-rate schedules
 *   amp_config.h   opt levels O0-O3, amp properties, the loss scaler
 *   amp.h          amp.initialize / scale_loss / optimizer.step
 *   data.h         IDX and CIFAR datasets, the batch loader
 *   safetensors.h  reading and writing safetensors files
 *   checkpoint.h   checkpoints and exact resume
 *   backend.h      devices: choosing one, its options and statistics
 *   comm.h         communicators for data-parallel training
 *   version.h      version, build type, backends and CPU paths (config.h: the same as macros)
 */
#ifndef AMPC_AMPC_H
#define AMPC_AMPC_H

#include "ampc/amp.h"
#include "ampc/amp_config.h"
#include "ampc/backend.h"
#include "ampc/checkpoint.h"
#include "ampc/comm.h"
#include "ampc/data.h"
#include "ampc/dtype.h"
#include "ampc/graph.h"
#include "ampc/nn.h"
#include "ampc/optim.h"
#include "ampc/rng.h"
#include "ampc/safetensors.h"
#include "ampc/status.h"
#include "ampc/tensor.h"
#include "ampc/version.h"

#endif
