/* The backend registry and device objects. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status_internal.h"

static const ampc__backend *const backends[] = {
    &ampc__backend_cpu,
    &ampc__backend_cpu_guarded,
#ifdef AMPC__BACKEND_CUDA
    &ampc__backend_cuda,
#endif
    NULL,
};

const ampc__backend *const *ampc__backends(void) { return backends; }

ampc_status ampc__backend_find(const char *name, const ampc__backend **out) {
  *out = NULL;
  if (!name) name = "cpu";
  for (const ampc__backend *const *b = backends; *b; b++)
    if (strcmp((*b)->name, name) == 0) {
      *out = *b;
      return AMPC_OK;
    }
#ifndef AMPC__BACKEND_CUDA
  if (strcmp(name, "cuda") == 0)
    return ampc__error(AMPC_EUNSUPPORTED, "backend 'cuda': ampc was built without CUDA (backends built: %s)",
                       ampc_backend_names());
#endif
  return ampc__error(AMPC_EINVAL, "unknown backend '%s' (backends built: %s)", name, ampc_backend_names());
}

/* made once, whichever thread asks first (two threads' errors naming the
 * list at once raced on a half-written one) */
static char backend_names[128];
static pthread_once_t backend_names_once = PTHREAD_ONCE_INIT;
static void backend_names_make(void) {
  size_t o = 0;
  for (const ampc__backend *const *b = backends; *b && o < sizeof backend_names; b++)
    o += (size_t)snprintf(backend_names + o, sizeof backend_names - o, "%s%s", b == backends ? "" : ", ", (*b)->name);
}

const char *ampc_backend_names(void) {
  pthread_once(&backend_names_once, backend_names_make);
  return backend_names;
}

void ampc_backend_opts_default(ampc_backend_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->conv = AMPC_CONV_AUTO;
}

ampc_status ampc_backend_check(const char *name) {
  ampc__device *d;
  AMPC_TRY(ampc__device_create(&d, name, NULL));
  ampc__device_unref(d);
  return AMPC_OK;
}

ampc_status ampc__device_create(ampc__device **out, const char *name, const ampc_backend_opts *o) {
  *out = NULL;
  const ampc__backend *be;
  AMPC_TRY(ampc__backend_find(name, &be));
  if (o && (o->conv < AMPC_CONV_AUTO || o->conv > AMPC_CONV_DIRECT))
    return ampc__error(AMPC_EINVAL, "backend %s: unknown convolution algorithm %d", be->name, (int)o->conv);
  if (o && o->threads < 0) return ampc__error(AMPC_EINVAL, "backend %s: threads %d", be->name, o->threads);
  if (o && o->device < 0) return ampc__error(AMPC_EINVAL, "backend %s: device %d", be->name, o->device);
  ampc__device *d = calloc(1, sizeof *d);
  if (!d) return ampc__error(AMPC_ENOMEM, "backend %s: out of memory", be->name);
  d->be = be;
  d->refs = 1;
  if (o) d->opts = *o;
  else ampc_backend_opts_default(&d->opts);
  ampc_status s = be->create(d);
  if (s < 0) {
    free(d);
    return ampc__error_prefix(s, "backend %s", be->name);
  }
  *out = d;
  return AMPC_OK;
}

ampc__device *ampc__device_ref(ampc__device *d) {
  if (d) d->refs++;
  return d;
}

void ampc__device_unref(ampc__device *d) {
  if (!d || --d->refs > 0) return;
  d->be->destroy(d);
  free(d);
}
