#include <stdarg.h>
#include <string.h>

#include "core/status_internal.h"

static _Thread_local char ampc__msg[2048];

const char *ampc_status_name(ampc_status s) {
  switch (s) {
#define AMPC__CASE(name, value, desc) \
  case value:                         \
    return #name;
    AMPC_STATUS_MAP(AMPC__CASE)
#undef AMPC__CASE
  }
  return "UNKNOWN";
}

const char *ampc_status_str(ampc_status s) {
  switch (s) {
#define AMPC__CASE(name, value, desc) \
  case value:                         \
    return desc;
    AMPC_STATUS_MAP(AMPC__CASE)
#undef AMPC__CASE
  }
  return "unknown error";
}

const char *ampc_last_error(void) { return ampc__msg; }

void ampc_clear_error(void) { ampc__msg[0] = '\0'; }

/* Messages are one line, whatever the file or flag they quote (a name read
 * from a file may hold a newline or a terminal escape): each control
 * character becomes '?' -- C0 and DEL, and in UTF-8 the C1 controls
 * (U+0080..U+009F: NEL, CSI, ...) and the line and paragraph separators
 * U+2028 and U+2029. */
void ampc__one_line(char *m) {
  unsigned char *r = (unsigned char *)m, *w = r;
  while (*r) {
    if (*r < 0x20 || *r == 0x7f) {
      *w++ = '?';
      r++;
    } else if (r[0] == 0xc2 && r[1] >= 0x80 && r[1] <= 0x9f) {
      *w++ = '?';
      r += 2;
    } else if (r[0] == 0xe2 && r[1] == 0x80 && (r[2] == 0xa8 || r[2] == 0xa9)) {
      *w++ = '?';
      r += 3;
    } else {
      *w++ = *r++;
    }
  }
  *w = '\0';
}

ampc_status ampc__error(ampc_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ampc__msg, sizeof ampc__msg, fmt, ap);
  va_end(ap);
  ampc__one_line(ampc__msg);
  return code;
}

ampc_status ampc__error_prefix(ampc_status code, const char *fmt, ...) {
  char prefix[1024], old[sizeof ampc__msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, ampc__msg, sizeof old);
  size_t np = strlen(prefix);
  if (np > sizeof ampc__msg - 3) np = sizeof ampc__msg - 3;
  memcpy(ampc__msg, prefix, np);
  memcpy(ampc__msg + np, ": ", 2);
  size_t room = sizeof ampc__msg - np - 3, no = strnlen(old, room);
  memcpy(ampc__msg + np + 2, old, no);
  ampc__msg[np + 2 + no] = '\0';
  ampc__one_line(ampc__msg);
  return code;
}
