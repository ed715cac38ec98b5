# cad_add_skipped_test(NAME REASON): registers a test that ctest reports as "Skipped" with REASON in its
# output, for a suite this configure cannot run (a missing dependency, a sanitizer build). A suite that
# is merely absent from the test list is invisible: `ctest` then says "100% tests passed" without it.
set(CAD_SKIP_RETURN_CODE 77)  # the automake convention; any code works with SKIP_RETURN_CODE
function(cad_add_skipped_test name reason)
  add_test(NAME ${name} COMMAND sh -c "echo \"SKIP ${name}: $1\"; exit ${CAD_SKIP_RETURN_CODE}" sh "${reason}")
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${CAD_SKIP_RETURN_CODE})
endfunction()
