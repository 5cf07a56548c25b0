// meshlearn: one binary, git-style subcommands. Each subcommand lives in cmd_<name>.cc.
#include <cstdlib>
#include <iostream>

#include "meshlearn/base/env.h"
#include "meshlearn/base/log.h"
#include "meshlearn/cli.h"

int main(int argc, char** argv) {
  using meshlearn::cli::GlobalOptions;
  GlobalOptions g;
  const char* home = std::getenv("MESHLEARN_HOME");
  // A relative $MESHLEARN_HOME or --home is relative to the working directory (docs/paths.md);
  // made absolute once parsed, so every child process and every file written names one place.
  g.home = home ? home : "~/.meshlearn";

  CLI::App app{"meshlearn: train machine-learning models on a network of computers that do not "
               "trust each other, and prove that the training happened."};
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", std::string(MESHLEARN_VERSION));
  app.add_flag("--json", g.json, "Print machine-readable JSON on stdout");
  app.add_option("--log-level", g.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_option("--home", g.home, "Directory for keys and local state ($MESHLEARN_HOME)")
      ->capture_default_str();
  app.footer(
      "Examples:\n"
      "  meshlearn devnet --solvers 4 --task examples/fashion-mlp.toml --out out/devnet\n"
      "  meshlearn version\n"
      "  meshlearn keys new alice\n"
      "  meshlearn train examples/fashion-mlp.toml\n"
      "  meshlearn chain init --dir chain --faucet && meshlearn chain serve --dir chain\n"
      "Run `meshlearn COMMAND --help` for a command's options. Docs: docs/index.md");
  app.parse_complete_callback([&g] {
    g.home = meshlearn::AbsolutePath(g.home);
    meshlearn::Status s = meshlearn::SetLogLevel(g.log_level);
    if (!s.ok()) throw CLI::ValidationError("--log-level", s.message());
    meshlearn::InitLogging(g.log_level);
  });
  meshlearn::cli::AddAllCommands(app, g);
  // Commands run inside parse (CLI11 callbacks). A command reports errors as Status; an exception
  // that still escapes one -- most often nlohmann::json's, from an answer of a shape nobody
  // checked -- is an error message and exit code 1, never an abort.
  auto fail = [&g](const std::string& what) {
    g.Exit(meshlearn::Internal(what));
    return 1;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error (unknown option, bad value) exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const nlohmann::json::exception& e) {
    return fail(std::string("malformed JSON (an answer from the ledger or a file did not have the "
                            "expected shape): ") + e.what());
  } catch (const std::exception& e) {
    return fail(std::string("unexpected failure: ") + e.what());
  }
  return g.exit_code;
}
