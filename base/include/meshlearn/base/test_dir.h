// Temporary directories for tests: the one place every test binary makes them.
//
//   const std::string dir = meshlearn::TestDir("devnet");  // /tmp/meshlearn-devnet-XXXXXX
//
// The directories a test process made are removed when it exits if all of its tests passed; when
// one failed they stay, and their paths are printed, so the failure can be looked at. With
// MESHLEARN_KEEP_TEST_DIRS=1 they always stay. CTest runs each test in a process of its own, so a
// failed test keeps only its own directories. (Before this, every test kept them: a devnet test
// leaves 400 MB, and a few days of test runs filled the disk.)
//
// Only for test binaries: it reports through GoogleTest.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace meshlearn {
namespace test_dir_internal {

struct Registry {
  std::mutex mu;
  std::vector<std::string> dirs;
};

inline Registry& Dirs() {
  static Registry r;  // made before RemoveAll is registered, so destroyed after it runs
  return r;
}

inline void RemoveAll() {
  Registry& r = Dirs();
  std::lock_guard<std::mutex> lock(r.mu);
  const char* keep = std::getenv("MESHLEARN_KEEP_TEST_DIRS");
  const bool passed = ::testing::UnitTest::GetInstance()->Passed();
  if (!passed || (keep != nullptr && *keep != '\0' && std::string_view(keep) != "0")) {
    for (const std::string& d : r.dirs) {
      std::fprintf(stderr, "test directory kept: %s\n", d.c_str());
    }
    return;
  }
  for (const std::string& d : r.dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);  // best effort: a leftover is only disk space
  }
}

}  // namespace test_dir_internal

// A new, empty directory /tmp/meshlearn-<what>-XXXXXX, removed when the process exits (above).
inline std::string TestDir(std::string_view what) {
  std::string path = "/tmp/meshlearn-" + std::string(what) + "-XXXXXX";
  if (mkdtemp(path.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << path << ") failed";
    return path;  // not registered: nothing under /tmp is ever removed by mistake
  }
  test_dir_internal::Registry& r = test_dir_internal::Dirs();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.dirs.empty()) std::atexit(test_dir_internal::RemoveAll);
  r.dirs.push_back(path);
  return path;
}

}  // namespace meshlearn
