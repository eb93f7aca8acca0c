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
  /* in UTF-8: the C1 controls (NEL U+0085, CSI U+009B) and the line and
   * paragraph separators break a line or drive a terminal too; other
   * characters stay */
  ampc__error(AMPC_EFORMAT, "key '%s'", "x\xe2\x80\xa8y\xc2\x85z\xc2\x9b" "2J\xe2\x80\xa9\xc3\xa9\xe2\x82\xac\xc2\xa0.");
  CHECK_MSG(strcmp(ampc_last_error(), "key 'x?y?z?2J?\xc3\xa9\xe2\x82\xac\xc2\xa0.'") == 0, "%s", ampc_last_error());
  /* a long message keeps its end (paths of a few hundred characters) */
  char path[301];
  memset(path, 'p', 300);
  path[300] = '\0';
  ampc__error(AMPC_EFORMAT, "%s has 5x5 images but %s has 4x4 images", path, path);
  CHECK(strstr(ampc_last_error(), "has 4x4 images") != NULL);
  ampc_clear_error();
}

TEST_MAIN(TEST_ENTRY(status_names), TEST_ENTRY(error_message), TEST_ENTRY(error_message_one_line))
