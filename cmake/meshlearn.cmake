# Helpers shared by every library's CMakeLists.txt.

# meshlearn_library(NAME name SOURCES ... DEPS ...)
# A static library with public headers under <dir>/include (included as <meshlearn/<lib>/x.h>).
function(meshlearn_library)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SOURCES})
  target_include_directories(${ARG_NAME} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
endfunction()

# meshlearn_test(NAME name SOURCES ... DEPS ... [LABELS label] [TIMEOUT s]
#                [SLOW_TESTS pattern...] [LONG_TESTS pattern...] [SLOW_TIMEOUT s] [LONG_TIMEOUT s])
# A GoogleTest binary; each TEST becomes its own CTest entry, labelled LABELS (default "unit").
# Tests run with the source tree as working directory so they can find fixtures by relative path.
# SLOW_TESTS and LONG_TESTS name the binary's tests (gtest patterns: `Suite.Name`, `Suite.*`) that
# get the label "slow" (release runs only: scripts/test.sh leaves them out of the sanitizer run) or
# "long" (minutes: run with MESHLEARN_SLOW_TESTS=1) instead, so that one binary holds a subject's
# fast and slow tests and is compiled once.
function(meshlearn_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT;SLOW_TIMEOUT;LONG_TIMEOUT"
                        "SOURCES;DEPS;LABELS;SLOW_TESTS;LONG_TESTS" ${ARGN})
  if(NOT MESHLEARN_BUILD_TESTS)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  # GoogleTest's header is the slowest part of compiling a test file; precompile it once per binary.
  target_precompile_headers(${ARG_NAME} PRIVATE <gtest/gtest.h>)
  # The code under test is the libraries, built -O2; a test file itself only sets up and asserts,
  # and -O0 compiles it in about half the time (network_sim_test.cc: 23 s -> 12 s). (-O1 is not used:
  # GCC 12 then reports false out-of-bounds copies in std::string concatenation, bug 105329.)
  target_compile_options(${ARG_NAME} PRIVATE $<$<CONFIG:Release>:-O0>)
  target_compile_definitions(${ARG_NAME} PRIVATE
                             MESHLEARN_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                             MESHLEARN_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  # The slow and long tests are discovered on their own, with their label and timeout; the rest
  # are discovered with them filtered out.
  set(singled_out "")
  foreach(kind slow long)
    string(TOUPPER ${kind} KIND)
    if(ARG_${KIND}_TESTS)
      list(JOIN ARG_${KIND}_TESTS ":" filter)
      set(timeout ${ARG_${KIND}_TIMEOUT})
      if(NOT timeout)
        set(timeout ${ARG_TIMEOUT})
      endif()
      _meshlearn_discover(${ARG_NAME} ${kind} ${timeout} "${filter}")
      list(APPEND singled_out ${ARG_${KIND}_TESTS})
    endif()
  endforeach()
  set(rest "")
  if(singled_out)
    list(JOIN singled_out ":" rest)
    set(rest "-${rest}")
  endif()
  _meshlearn_discover(${ARG_NAME} "${labels}" ${ARG_TIMEOUT} "${rest}")
endfunction()

# Registers the tests of `target` that match the gtest `filter` (all when empty) with one label.
# Slow tests train models on both cores: they run one at a time so they do not fight over CPUs
# (and time out) under `ctest -j2`; "long" (minutes; scripts/test.sh runs them with
# MESHLEARN_SLOW_TESTS=1) is serial too. One label per call: gtest_discover_tests cannot pass a list.
function(_meshlearn_discover target label timeout filter)
  set(serial FALSE)
  if(label STREQUAL "slow" OR label STREQUAL "long")
    set(serial TRUE)
  endif()
  set(filter_args "")
  if(filter)
    set(filter_args TEST_FILTER "${filter}")
  endif()
  gtest_discover_tests(${target} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} ${filter_args}
                       PROPERTIES LABELS "${label}" TIMEOUT ${timeout} RUN_SERIAL ${serial}
                       DISCOVERY_TIMEOUT 60)
endfunction()
