/* Communicators: the generic part. */
#include "core/status_internal.h"
#include "dist/comm_internal.h"

void ampc_comm_free(ampc_comm *c) {
  if (c) c->ops->free(c);
}
int ampc_comm_rank(const ampc_comm *c) { return c ? c->rank : 0; }
int ampc_comm_size(const ampc_comm *c) { return c ? c->size : 1; }
const char *ampc_comm_kind(const ampc_comm *c) { return c ? c->ops->name : "none"; }
