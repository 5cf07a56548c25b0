# Helpers shared by every library's CMakeLists.txt.

# meshlearn_library(NAME name SOURCES ... DEPS ...)
# A static library with public headers under <dir>/include (included as <meshlearn/<lib>/x.h>).
function(meshlearn_library)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SOURCES})
  target_include_directories(${ARG_NAME} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
endfunction()

# meshlearn_test(NAME name SOURCES ... DEPS ... [LABELS ...])
# A GoogleTest binary; each TEST becomes its own CTest entry. Tests run with the source tree as
# working directory so they can find fixtures by relative path.
function(meshlearn_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
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
  target_compile_definitions(${ARG_NAME} PRIVATE
                             MESHLEARN_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                             MESHLEARN_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  # Slow tests train models on both cores: run them one at a time so they do not fight over CPUs
  # (and time out) under `ctest -j2`.
  # "long" (minutes; scripts/test.sh runs them with MESHLEARN_SLOW_TESTS=1) is serial too. One
  # label per test: gtest_discover_tests cannot pass a list.
  set(serial FALSE)
  if("slow" IN_LIST labels OR "long" IN_LIST labels)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${ARG_NAME} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                       PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT} RUN_SERIAL ${serial}
                       DISCOVERY_TIMEOUT 60)
endfunction()
