#include "ampc/status.h"
#include "core/status_internal.h"
#include "test.h"

TEST(status_names) {
  CHECK(strcmp(ampc_status_name(AMPC_EINVAL), "EINVAL") == 0);
  CHECK(strcmp(ampc_status_name(12345), "UNKNOWN") == 0);
  CHECK(strcmp(ampc_status_str(AMPC_OK), "success") == 0);
}

TEST(error_message) {
  CHECK(ampc__error(AMPC_EFORMAT, "idx: %s: bad magic %d", "x.idx", 7) == AMPC_EFORMAT);
  CHECK(strcmp(ampc_last_error(), "idx: x.idx: bad magic 7") == 0);
  ampc__error_prefix(AMPC_EFORMAT, "loading %s", "data");
  CHECK(strcmp(ampc_last_error(), "loading data: idx: x.idx: bad magic 7") == 0);
  ampc_clear_error();
  CHECK(ampc_last_error()[0] == '\0');
}

TEST_MAIN(TEST_ENTRY(status_names), TEST_ENTRY(error_message))
