cmake_minimum_required(VERSION 3.25)
# Checks that a plugin's dynamic symbol table defines exactly the ABI entry symbol (cmake -P):
#   -DNM=<nm> -DPLUGIN=<.so> [-DEXPORTS=<version script>]
# A plugin built with its own version script (cad_add_plugin's EXPORTS) may also define the symbols that
# script lists under `global:`; every other plugin exactly the entry.
# `nm -D --defined-only` lists the defined dynamic symbols. The toolchain adds none to our plugins
# (the version script makes everything else local), so no exceptions are allowed: if a toolchain ever
# adds one, name it in TOOLCHAIN_SYMBOLS below rather than loosening the check.
set(ALLOWED cad_plugin_entry_v1)
if(EXPORTS)
  file(READ ${EXPORTS} script)
  string(REGEX MATCH "global:([^:]*)local:" globals "${script}")
  string(REGEX MATCHALL "[A-Za-z_][A-Za-z0-9_]*" listed "${CMAKE_MATCH_1}")
  foreach(entry IN LISTS listed)
    list(APPEND ALLOWED ${entry})
  endforeach()
endif()
set(TOOLCHAIN_SYMBOLS "")
execute_process(COMMAND ${NM} -D --defined-only ${PLUGIN}
                RESULT_VARIABLE code OUTPUT_VARIABLE output ERROR_VARIABLE errors)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${PLUGIN} failed (${code}): ${errors}")
endif()
string(REPLACE "\n" ";" lines "${output}")
set(found "")
set(unexpected "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] +([^ ]+)$")
    set(symbol ${CMAKE_MATCH_1})
    list(APPEND found ${symbol})
    if(NOT symbol IN_LIST ALLOWED AND NOT symbol IN_LIST TOOLCHAIN_SYMBOLS)
      list(APPEND unexpected ${symbol})
    endif()
  endif()
endforeach()
if(unexpected)
  message(FATAL_ERROR "${PLUGIN} exports symbols besides ${ALLOWED}: ${unexpected}")
endif()
if(NOT "cad_plugin_entry_v1" IN_LIST found)
  message(FATAL_ERROR "${PLUGIN} does not export cad_plugin_entry_v1 (defined dynamic symbols: ${found})")
endif()
message("${PLUGIN}: exports exactly ${ALLOWED}")
