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
#                [SLOW_TESTS pattern...] [LONG_TESTS pattern...] [SLOW_TIMEOUT s] [LONG_TIMEOUT s]
#                [SERIAL] [COST s] [ONE_PROCESS pattern...])
# A GoogleTest binary; each TEST becomes its own CTest entry, labelled LABELS (default "unit").
# Tests run with the source tree as working directory so they can find fixtures by relative path.
# SLOW_TESTS and LONG_TESTS name the binary's tests (gtest patterns: `Suite.Name`, `Suite.*`) that
# get the label "slow" (release runs only: scripts/test.sh leaves them out of the sanitizer run) or
# "long" (minutes: run with MESHLEARN_SLOW_TESTS=1) instead, so that one binary holds a subject's
# fast and slow tests and is compiled once.
# SERIAL: the binary's slow tests compute on both cores (they train models), so ctest runs each
# alone; beside them a devnet test's processes would starve and miss their deadlines. Slow tests
# that mostly wait (devnets, etcd, a browser) are not SERIAL: they overlap with the rest. Long
# tests are always run alone.
# COST: about how many seconds each of the binary's tests takes (process-level tests: devnets).
# `ctest -j` starts the costliest tests first, so their waits overlap with the short tests instead
# of trailing alone at the end of the run.
# ONE_PROCESS: gtest patterns (`A*:B*` for several) whose tests run as one CTest entry, in one
# process, named after the pattern, with the binary's label (its slow and long tests left out), or
# with the label "slow" or "long" where SLOW_TESTS or LONG_TESTS name the same pattern. For tests
# that build the same model and train the same honest run, which a process keeps for the next
# test: as CTest entries of their own, every process paid for it again.
function(meshlearn_test)
  cmake_parse_arguments(ARG "SERIAL" "NAME;TIMEOUT;SLOW_TIMEOUT;LONG_TIMEOUT;COST"
                        "SOURCES;DEPS;LABELS;SLOW_TESTS;LONG_TESTS;ONE_PROCESS" ${ARGN})
  if(NOT MESHLEARN_BUILD_TESTS)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  if(NOT ARG_COST)
    set(ARG_COST 0)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  # GoogleTest's header is the slowest part of compiling a test file: file by file, precompile it
  # once per binary. A unity build parses it once per batch already, and there building the
  # precompiled header costs more than it saves (base, net, protocol, ledger tests: 112 -> 90 s).
  if(NOT CMAKE_UNITY_BUILD)
    target_precompile_headers(${ARG_NAME} PRIVATE <gtest/gtest.h>)
  endif()
  # The code under test is the libraries, built -O2; a test file itself only sets up and asserts,
  # and -O0 compiles it in about half the time (network_sim_test.cc: 23 s -> 12 s). (-O1 is not used:
  # GCC 12 then reports false out-of-bounds copies in std::string concatenation, bug 105329.)
  target_compile_options(${ARG_NAME} PRIVATE $<$<CONFIG:Release>:-O0>)
  # The catch: a template or inline function both compile (std::string, std::map, nlohmann::json)
  # is linked once, from the first object file that defines it, and the test files come before
  # the libraries on the link line, so the libraries' -O2 code called the test files' -O0 copies
  # (ChaosTest.SeedSweep spent half its CPU time there). The libraries are loaded first, whole,
  # so their -O2 copies are the ones linked, for the test files too (10 chaos seeds: 5.7 -> 2.9 s
  # of CPU time, the same traces). This is set up once the whole tree is configured, since a
  # library may be defined after its test (the ledger service's tests; net after ledger).
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT APPLE)
    cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY [[${CMAKE_SOURCE_DIR}]]
                              CALL _meshlearn_libraries_first [[${ARG_NAME}]] ${ARG_DEPS})")
  endif()
  target_compile_definitions(${ARG_NAME} PRIVATE
                             MESHLEARN_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                             MESHLEARN_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  # The slow and long tests are registered on their own (discovered, or one entry for a
  # ONE_PROCESS pattern), with their label and timeout; then the ONE_PROCESS entries of the
  # binary's label; the rest are discovered with all of those filtered out.
  set(singled_out "")
  foreach(kind slow long)
    string(TOUPPER ${kind} KIND)
    if(ARG_${KIND}_TESTS)
      set(timeout ${ARG_${KIND}_TIMEOUT})
      if(NOT timeout)
        set(timeout ${ARG_TIMEOUT})
      endif()
      set(serial ${ARG_SERIAL})
      if(kind STREQUAL "long")
        set(serial TRUE)
      endif()
      set(discovered "")
      foreach(pattern ${ARG_${KIND}_TESTS})
        if(pattern IN_LIST ARG_ONE_PROCESS)
          _meshlearn_one_process(${ARG_NAME} "${pattern}" "" ${kind} ${timeout} ${serial}
                                 ${ARG_COST})
        else()
          list(APPEND discovered ${pattern})
        endif()
      endforeach()
      if(discovered)
        list(JOIN discovered ":" filter)
        _meshlearn_discover(${ARG_NAME} ${kind} ${timeout} "${filter}" ${serial} ${ARG_COST})
      endif()
      list(APPEND singled_out ${ARG_${KIND}_TESTS})
    endif()
  endforeach()
  set(not_here "")
  if(singled_out)
    list(JOIN singled_out ":" not_here)
    set(not_here "-${not_here}")
  endif()
  set(serial FALSE)
  if(ARG_SERIAL AND labels STREQUAL "slow")
    set(serial TRUE)
  endif()
  foreach(pattern ${ARG_ONE_PROCESS})
    if(NOT pattern IN_LIST ARG_SLOW_TESTS AND NOT pattern IN_LIST ARG_LONG_TESTS)
      _meshlearn_one_process(${ARG_NAME} "${pattern}" "${not_here}" "${labels}" ${ARG_TIMEOUT}
                             ${serial} ${ARG_COST})
      list(APPEND singled_out ${pattern})
    endif()
  endforeach()
  set(rest "")
  if(singled_out)
    list(JOIN singled_out ":" rest)
    set(rest "-${rest}")
  endif()
  _meshlearn_discover(${ARG_NAME} "${labels}" ${ARG_TIMEOUT} "${rest}" ${serial} ${ARG_COST})
endfunction()

# Registers the tests of `target` that match the gtest `pattern` (less those `not_here` names: a
# gtest negative filter) as one CTest entry, named `pattern`, that runs them in one process.
function(_meshlearn_one_process target pattern not_here label timeout serial cost)
  add_test(NAME "${pattern}" COMMAND ${target} "--gtest_filter=${pattern}${not_here}"
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties("${pattern}" PROPERTIES LABELS "${label}" TIMEOUT ${timeout}
                                               RUN_SERIAL ${serial} COST ${cost})
endfunction()

# Registers the tests of `target` that match the gtest `filter` (all when empty) with one label
# (gtest_discover_tests cannot pass a list), run alone when `serial`, with the scheduling `cost`.
function(_meshlearn_discover target label timeout filter serial cost)
  set(filter_args "")
  if(filter)
    set(filter_args TEST_FILTER "${filter}")
  endif()
  gtest_discover_tests(${target} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} ${filter_args}
                       PROPERTIES LABELS "${label}" TIMEOUT ${timeout} RUN_SERIAL ${serial}
                                  COST ${cost}
                       DISCOVERY_TIMEOUT 60)
endfunction()

# Links the project's static libraries that `target` links (`deps` and theirs) whole, before its
# own object files, in the release build (meshlearn_test: which copy of a template is linked).
function(_meshlearn_libraries_first target)
  _meshlearn_static_libraries(libraries ${ARGN})
  set(whole "")
  foreach(library ${libraries})
    list(APPEND whole $<TARGET_FILE:${library}>)
  endforeach()
  set_property(TARGET ${target} APPEND PROPERTY LINK_OPTIONS
               "$<$<CONFIG:Release>:-Wl,--whole-archive;${whole};-Wl,--no-whole-archive>")
endfunction()

# The project's static libraries that `deps` link, directly or through one another (not the
# imported ones: GoogleTest, system libraries), into `out`.
function(_meshlearn_static_libraries out)
  set(found "")
  set(queue ${ARGN})
  while(queue)
    list(POP_FRONT queue dep)
    if(NOT TARGET ${dep} OR dep IN_LIST found)
      continue()
    endif()
    get_target_property(type ${dep} TYPE)
    get_target_property(imported ${dep} IMPORTED)
    if(NOT type STREQUAL "STATIC_LIBRARY" OR imported)
      continue()
    endif()
    list(APPEND found ${dep})
    get_target_property(links ${dep} LINK_LIBRARIES)
    if(links)
      list(APPEND queue ${links})
    endif()
  endwhile()
  set(${out} ${found} PARENT_SCOPE)
endfunction()
