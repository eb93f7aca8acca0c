/*
 * test.h -- the one test runner every unit-test executable shares.
 *
 *     TEST(dtype_roundtrip) { CHECK(1 + 1 == 2); CHECK_NEAR(x, 1.0, 1e-6); }
 *     TEST_MAIN(TEST_ENTRY(dtype_roundtrip), ...)
 *
 * A failing CHECK prints file:line and the expression, and marks the case
 * failed (the case goes on, so one run shows every failure). The program
 * prints "N passed, N failed" and exits non-zero if anything failed.
 * Run some cases with: ./test_x case_name [more_case_names]
 */
#ifndef AMPC_TEST_H
#define AMPC_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test__failed_checks;

#define TEST(name) static void test_##name(void)
#define TEST_ENTRY(name) {#name, test_##name}

#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
              #cond);                                                  \
      test__failed_checks++;                                           \
    }                                                                  \
  } while (0)

#define CHECK_MSG(cond, ...)                                               \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, "\n");                                               \
      test__failed_checks++;                                               \
    }                                                                      \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                 \
  do {                                                                        \
    double test__a = (double)(a), test__b = (double)(b);                      \
    if (!(fabs(test__a - test__b) <= (tol))) {                                \
      fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g (tol %g)\n", \
              __FILE__, __LINE__, #a, test__a, #b, test__b, (double)(tol));   \
      test__failed_checks++;                                                  \
    }                                                                         \
  } while (0)

/* A call returning ampc_status must succeed; prints ampc_last_error() if not. */
#define CHECK_OK(expr)                                                          \
  do {                                                                          \
    int test__s = (expr);                                                       \
    if (test__s < 0) {                                                          \
      fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__, #expr, \
              test__s, ampc_last_error());                                      \
      test__failed_checks++;                                                    \
    }                                                                           \
  } while (0)

/* A call must fail with the given code and a message containing substr. */
#define CHECK_ERR(expr, code, substr)                                          \
  do {                                                                         \
    int test__s = (expr);                                                      \
    if (test__s != (code) || !strstr(ampc_last_error(), (substr))) {           \
      fprintf(stderr, "%s:%d: %s: expected %d containing \"%s\", got %d: %s\n", \
              __FILE__, __LINE__, #expr, (int)(code), (substr), test__s,       \
              ampc_last_error());                                              \
      test__failed_checks++;                                                   \
    }                                                                          \
  } while (0)

typedef struct {
  const char *name;
  void (*fn)(void);
} test__entry;

/* The case is named on the command line (or none is). */
static inline int test__named(const char *name, int argc, char **argv) {
  for (int a = 1; a < argc; a++)
    if (strcmp(argv[a], name) == 0) return 1;
  return argc <= 1;
}

static inline int test__run(const test__entry *t, int n, int argc, char **argv) {
  int passed = 0, failed = 0;
  for (int i = 0; i < n; i++) {
    if (!test__named(t[i].name, argc, argv)) continue;
    int before = test__failed_checks;
    t[i].fn();
    if (test__failed_checks == before) {
      passed++;
      printf("ok   %s\n", t[i].name);
    } else {
      failed++;
      printf("FAIL %s\n", t[i].name);
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

#define TEST_MAIN(...)                                                  \
  int main(int argc, char **argv) {                                     \
    static const test__entry tests[] = {__VA_ARGS__};                   \
    return test__run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv); \
  }

#endif
