/* c_check.h -- the pass/fail counting of the strict-C99 host tests (each test program includes it once):
 * check() counts a result and prints what failed; main prints "N passed, M failed" from the counters. */
#ifndef CAD_TESTS_HOST_C_CHECK_H
#define CAD_TESTS_HOST_C_CHECK_H

#include <stdio.h>

static int passed = 0, failed = 0;

static void check(int ok, const char* what, const char* detail) {
  if (ok) {
    passed++;
  } else {
    failed++;
    printf("FAIL %s: %s\n", what, detail ? detail : "");
  }
}

#endif
