// Small helpers shared by the benchmark programs.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace meshlearn::bench {

// "a,b,,c" -> {"a", "b", "c"}: the value of a list flag such as --benchmarks=a,b.
inline std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace meshlearn::bench
