/*
 * status.h -- error codes and the thread-local error message.
 *
 * Every fallible call in libampc returns an ampc_status: 0 on success, a
 * negative AMPC_E* code on failure. The call that fails also leaves a
 * one-line message naming what was wrong ("cifar10: data_batch_3.bin:
 * record 40: label 12 out of range [0, 10)"), read with ampc_last_error()
 * on the same thread. The library never prints and never exits.
 *
 *     ampc_dataset *ds;
 *     if (ampc_dataset_open(&ds, AMPC_DATASET_CIFAR10, "data/cifar-10-batches-bin", 1, 0) < 0)
 *         fprintf(stderr, "error: %s\n", ampc_last_error());
 */
#ifndef AMPC_STATUS_H
#define AMPC_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, description) -- the one list the code and the strings come from. */
#define AMPC_STATUS_MAP(X)                                   \
  X(OK, 0, "success")                                        \
  X(EINVAL, -1, "invalid argument")                          \
  X(ENOMEM, -2, "out of memory")                             \
  X(EIO, -3, "input/output error")                           \
  X(EFORMAT, -4, "malformed file or data")                   \
  X(ERANGE, -5, "value out of range")                        \
  X(ENOTFOUND, -6, "not found")                              \
  X(EUNSUPPORTED, -7, "not supported")                       \
  X(ESTATE, -8, "call not valid in the current state")       \
  X(ENONFINITE, -9, "non-finite value")                      \
  X(EINTERRUPTED, -10, "interrupted")                        \
  X(ECOMM, -11, "communication between ranks failed")

typedef enum {
#define AMPC__STATUS_ENUM(name, value, desc) AMPC_##name = value,
  AMPC_STATUS_MAP(AMPC__STATUS_ENUM)
#undef AMPC__STATUS_ENUM
} ampc_status_code;

typedef int ampc_status;

/* "EINVAL", ... ; "UNKNOWN" for a value not in the list. */
const char *ampc_status_name(ampc_status s);
/* "invalid argument", ... */
const char *ampc_status_str(ampc_status s);
/* The message of the last failing call on this thread ("" if none). */
const char *ampc_last_error(void);
/* Clears this thread's message. */
void ampc_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
