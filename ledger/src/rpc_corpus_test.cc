// The fuzz corpus (fuzz/corpus/rpc) and bounded random mutations of it through HandleBody, in
// the ordinary gcc build: what the libFuzzer target does, deterministically and quickly.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "meshlearn/ledger/rpc.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;

std::vector<std::string> LoadCorpus() {
  std::vector<std::string> out;
  std::filesystem::path dir = std::filesystem::path(MESHLEARN_SOURCE_DIR) / "fuzz/corpus/rpc";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(ss.str());
  }
  return out;
}

void ExpectJsonRpcAnswer(const std::string& input, const std::string& answer) {
  json j = json::parse(answer, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "input: " << input << "\nanswer: " << answer;
  ASSERT_TRUE(j.is_object() || j.is_array()) << answer;
  if (j.is_object()) {
    EXPECT_EQ(j["jsonrpc"], "2.0") << answer;
    EXPECT_TRUE(j.contains("result") != j.contains("error")) << answer;
  }
}

std::string Mutate(std::string s, std::mt19937_64& rng, const std::vector<std::string>& corpus) {
  static const char kTokens[] = "{}[]\",:0123456789-eE.truefalsenull\\u ";
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // insert a JSON-ish character
        s.insert(pos, 1, kTokens[rng() % (sizeof(kTokens) - 1)]);
        break;
      case 2:  // delete a run
        if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 8);
        break;
      case 3:  // truncate
        s.resize(pos);
        break;
      case 4: {  // splice another corpus entry in
        const std::string& other = corpus[rng() % corpus.size()];
        size_t from = other.empty() ? 0 : rng() % other.size();
        s.insert(pos, other.substr(from, rng() % 64));
        break;
      }
      case 5:  // a big number or a long string
        s.insert(pos, rng() % 2 ? "18446744073709551616" : std::string(200, 'f'));
        break;
    }
  }
  return s;
}

TEST(RpcCorpus, CorpusAndMutationsAlwaysGetAJsonRpcAnswer) {
  testing::TestLedger t;
  RpcLimits limits;
  limits.max_wait_ms = 0;  // no input may block
  RpcService rpc(t.shared.get(), t.sequencer.get(), limits);
  // Some real state for the handlers to find.
  ASSERT_TRUE(t.sequencer->Submit(t.Transfer(t.alice, t.bob, 5, 0)).ok());
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());

  std::vector<std::string> corpus = LoadCorpus();
  ASSERT_GE(corpus.size(), 10u);
  corpus.push_back(testing::Request("send_tx", {{"tx", testing::TxHex(t.Transfer(t.alice, t.bob, 1, 1))}}).dump());
  for (const std::string& input : corpus) ExpectJsonRpcAnswer(input, rpc.HandleBody(input));

  std::mt19937_64 rng(20261129);
  int iterations = std::getenv("MESHLEARN_SLOW_TESTS") ? 200000 : 5000;
  for (int i = 0; i < iterations; ++i) {
    std::string input = Mutate(corpus[rng() % corpus.size()], rng, corpus);
    ExpectJsonRpcAnswer(input, rpc.HandleBody(input));
    if (::testing::Test::HasFailure()) break;
    if (i % 500 == 0) {
      ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
    }
  }
}

}  // namespace
}  // namespace meshlearn::ledger
