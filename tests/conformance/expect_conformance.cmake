cmake_minimum_required(VERSION 3.25)
# Runs `cad conformance` on one plugin and checks the outcome (cmake -P, used by ctest):
#   -DCAD=<cad binary> -DPLUGIN=<.so> -DEXPECT_EXIT=<code> [-DEXPECT_TEXT=<text1;text2>] [-DARGS=<extra;args>]
# Fails unless the exit code matches and every EXPECT_TEXT occurs in the output. Used to show that the
# kit catches each planted fault (exit 1 and the failing check's name in the output).
execute_process(COMMAND ${CAD} conformance ${PLUGIN} ${ARGS}
                RESULT_VARIABLE exit_code OUTPUT_VARIABLE output ERROR_VARIABLE errors)
message("${output}")
if(NOT exit_code STREQUAL EXPECT_EXIT)
  message(FATAL_ERROR "cad conformance ${PLUGIN} exited with ${exit_code}, expected ${EXPECT_EXIT}\n${errors}")
endif()
foreach(text IN LISTS EXPECT_TEXT)
  string(FIND "${output}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the output of cad conformance ${PLUGIN} does not contain '${text}'")
  endif()
endforeach()
