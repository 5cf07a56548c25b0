// meshlearn version: what this binary is and what the machine can do.
#include <iostream>

#include "meshlearn/base/cpu.h"
#include "meshlearn/cli.h"

namespace meshlearn::cli {
namespace {

void AddVersion(CLI::App& root, GlobalOptions& g) {
  CLI::App* cmd = root.add_subcommand("version", "Print version, git commit, build type and CPU");
  cmd->footer("Examples:\n  meshlearn version\n  meshlearn --json version");
  cmd->callback([&g] {
    const CpuFeatures& f = GetCpuFeatures();
    nlohmann::json j = {{"version", MESHLEARN_VERSION},
                        {"git_commit", MESHLEARN_GIT_COMMIT},
                        {"build_type", MESHLEARN_BUILD_TYPE},
                        {"compiler", __VERSION__},
                        {"cpu", CpuModelName()},
                        {"cpu_features", f.ToString()}};
    g.Output(j, [&] {
      std::cout << "meshlearn " << MESHLEARN_VERSION << " (commit " << MESHLEARN_GIT_COMMIT
                << ", " << MESHLEARN_BUILD_TYPE << " build, gcc " << __VERSION__ << ")\n"
                << "cpu: " << CpuModelName() << "\n"
                << "cpu features: " << f.ToString() << "\n";
    });
  });
}

}  // namespace

MESHLEARN_COMMAND(1, AddVersion);

}  // namespace meshlearn::cli
