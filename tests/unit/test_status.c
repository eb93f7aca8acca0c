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

/* A message is one line whatever it quotes: a key read from a file may hold
 * a newline or a terminal escape, which become '?'. */
TEST(error_message_one_line) {
  ampc__error(AMPC_EFORMAT, "safetensors: %s: key '%s' is bad", "f.st", "a\nb\rc\x1b[31md\x7f");
  CHECK(strcmp(ampc_last_error(), "safetensors: f.st: key 'a?b?c?[31md?' is bad") == 0);
  ampc__error(AMPC_EFORMAT, "inner\tvalue");
  ampc__error_prefix(AMPC_EFORMAT, "outer %s", "x\ny");
  CHECK(strcmp(ampc_last_error(), "outer x?y: inner?value") == 0);
  ampc_clear_error();
}

TEST_MAIN(TEST_ENTRY(status_names), TEST_ENTRY(error_message), TEST_ENTRY(error_message_one_line))
