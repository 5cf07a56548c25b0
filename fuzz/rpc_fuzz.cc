// libFuzzer target: arbitrary bytes into the ledger's JSON-RPC handlers (RpcService::HandleBody),
// over a real chain in a temp directory. Every answer must be a JSON-RPC response; nothing may
// crash, hang or leak. Long-polls are disabled (max_wait_ms = 0) so no input can block.
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DMESHLEARN_BUILD_FUZZ=ON
//   ninja -C build-fuzz rpc_fuzz && build-fuzz/ledger/rpc_fuzz fuzz/corpus/rpc -max_total_time=60
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "meshlearn/base/clock.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"

namespace {

using namespace meshlearn;
using namespace meshlearn::ledger;

struct Harness {
  Harness() {
    char tmpl[] = "/tmp/meshlearn-rpc-fuzz-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    KeySeed seed;
    seed.bytes.fill(1);
    KeyPair alice = KeyPair::FromSeed(seed);
    seed.bytes.fill(9);
    KeyPair seq = KeyPair::FromSeed(seed);
    Genesis g = DevnetGenesis({alice.public_key()}, 1'000'000, "meshlearn-fuzz");
    g.sequencer = seq.public_key();
    chain = std::move(Chain::Open(dir + "/chain.db", g)).value();
    shared = std::make_unique<SharedChain>(chain.get());
    sequencer = std::make_unique<Sequencer>(shared.get(), seq, &clock, SequencerOptions{.max_mempool = 1000});
    RpcLimits limits;
    limits.max_wait_ms = 0;
    rpc = std::make_unique<RpcService>(shared.get(), sequencer.get(), limits);
  }
  FakeClock clock{1'700'000'000'000};
  std::unique_ptr<Chain> chain;
  std::unique_ptr<SharedChain> shared;
  std::unique_ptr<Sequencer> sequencer;
  std::unique_ptr<RpcService> rpc;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();
  std::string answer = h->rpc->HandleBody(std::string_view(reinterpret_cast<const char*>(data), size));
  nlohmann::json j = nlohmann::json::parse(answer, nullptr, false);
  if (j.is_discarded() || !(j.is_object() || j.is_array())) {
    std::fprintf(stderr, "answer is not a JSON-RPC response: %s\n", answer.c_str());
    abort();
  }
  return 0;
}
